"""Batched KV-cache decoding: tokens/s at batch 1, 8 and 32 against batch 1 x B.

    python bench/decode_batch.py --checkpoint RUN --json FILE [--device cuda]
    python bench/decode_batch.py --preset gpu --device cuda --json FILE   # random weights

B sequences (random 16-token prompts of the model's vocabulary, greedy, no stop token:
the speed does not depend on the weights, so `--preset` decodes a preset's random
initialisation) decode together in one BatchDecoder through euler.inference.engine.BatchGenerator:
the prompts are fed and each sequence's first token chosen (untimed), then `steps`
decoding steps are timed, each one forward of B rows, the heads' logits and B choices.
tokens/s = B * steps / seconds; each batch size is run `rounds` times, alternating, and
its best and median round kept, with the load average before and after (the machine is
shared). The ideal is B times batch 1: the speed-up column says how close batching comes.
Each thread count of --threads (Numba threads the forward's kernels run on) is a table.
With --device cuda the decoder runs on the GPU backend's KV-cache kernels, twice: its steps
replayed as CUDA graphs (the default) and launched kernel by kernel (`cuda_graph=False`),
a table each; a row beside them times the full-context recompute decoder
(euler.inference.decode_device) on one sequence, for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from euler.inference.batch import BatchDecoder
from euler.inference.engine import BatchGenerator, GenRequest
from euler.model.config import PRESETS
from euler.model.transformer import Model
from euler.training import checkpoint


def decode_round(dec: BatchDecoder, B: int, steps: int, prompt_len: int, seed: int) -> float:
    """Seconds of `steps` batched decoding steps of B fresh sequences in dec's slots."""
    rng = np.random.default_rng(seed)
    gen = BatchGenerator(dec)
    for _ in range(B):
        prompt = tuple(int(t) for t in rng.integers(0, dec.cfg.vocab_size, prompt_len))
        gen.add(GenRequest(prompt, steps + 1))
    gen.step()  # the prompts, and every sequence's first token
    t0 = time.perf_counter()
    for _ in range(steps):
        events = gen.step()
        assert len(events) == B and all(e.token is not None for e in events)
    return time.perf_counter() - t0


def recompute_rate(ck, args, backend) -> float:
    """Best tokens/s of the recompute decoder on one sequence (greedy, `steps` tokens)."""
    from euler.inference.decode_device import RecomputeDecoder
    from euler.inference.generate import generate
    from euler.inference.sampling import SamplingConfig

    dec = RecomputeDecoder(ck.cfg, ck.params, backend, "fp32")
    prompt = np.random.default_rng(0).integers(0, ck.cfg.vocab_size, args.prompt_len)
    best = 0.0
    for _ in range(1 + args.rounds):  # the first compiles
        dec.truncate(0)
        res = generate(dec, prompt, args.steps, SamplingConfig(0.0, 0, 1.0))
        best = max(best, res.tokens_per_second)
    return best


def measure(ck, args, threads: int, backend=None, cuda_graph: bool = True) -> list[dict]:
    """The rows of one thread count: each batch size's best and median tokens/s."""
    decoders = {B: BatchDecoder(ck.cfg, ck.params, B, backend=backend, threads=threads,
                                cuda_graph=cuda_graph) for B in args.batches}  # fmt: skip
    for B, dec in decoders.items():  # compile or load the kernels, warm the caches
        decode_round(dec, B, 4, args.prompt_len, 0)
    seconds: dict[int, list[float]] = {B: [] for B in args.batches}
    for r in range(args.rounds):
        for B, dec in decoders.items():
            seconds[B].append(decode_round(dec, B, args.steps, args.prompt_len, 1 + r))
    rows = []
    for B in args.batches:
        rates = [B * args.steps / s for s in seconds[B]]
        rows.append({"batch": B, "best_tokens_per_s": max(rates),
                     "median_tokens_per_s": statistics.median(rates),
                     "ms_per_step_best": 1e3 * min(seconds[B]) / args.steps})  # fmt: skip
    one = rows[0]["best_tokens_per_s"] if args.batches[0] == 1 else None
    for row in rows:
        row["speedup_over_batch_1"] = row["best_tokens_per_s"] / one if one else None
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=Path, help="Checkpoint or run folder.")
    which.add_argument("--preset", choices=sorted(PRESETS), help="A preset, randomly initialised.")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=96, help="Timed steps a round.")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="Numba threads.")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", type=Path, help="Write the results here.")
    args = ap.parse_args()
    if args.checkpoint:
        ck = checkpoint.load(args.checkpoint)
    else:
        cfg = PRESETS[args.preset]
        ck = SimpleNamespace(
            cfg=cfg, params=Model(cfg, seed=0).params, path=f"{args.preset}, random"
        )
    backend, recompute = None, None
    if args.device == "cuda":
        from euler.backend import make_backend

        backend = make_backend("cuda", "fp32")
    if args.prompt_len + args.steps + 1 > ck.cfg.context:
        ap.error(f"--prompt-len + --steps + 1 must fit the context ({ck.cfg.context})")
    load_before = os.getloadavg()[0]
    if backend is None:
        tables = {(t, False): measure(ck, args, t) for t in args.threads}
    else:
        tables = {(1, g): measure(ck, args, 1, backend, g) for g in (True, False)}
        recompute = recompute_rate(ck, args, backend)
        print(f"recompute decoder, one sequence: {recompute:,.0f} tokens/s")
    for (threads, graphs), rows in tables.items():
        print("CUDA graphs" if graphs else "launched" if backend else f"{threads} thread(s)")
        print(f"{'batch':>5} {'best tok/s':>11} {'median':>9} {'ms/step':>8} {'x batch 1':>9}"
              f" {'ideal':>6}")  # fmt: skip
        for row in rows:
            speedup = row["speedup_over_batch_1"] or float("nan")
            print(f"{row['batch']:>5} {row['best_tokens_per_s']:>11,.0f} "
                  f"{row['median_tokens_per_s']:>9,.0f} {row['ms_per_step_best']:>8.2f} "
                  f"{speedup:>9.2f} {row['batch']:>6}")  # fmt: skip
    load = (load_before, os.getloadavg()[0])
    print(f"load average before and after: {load[0]:.2f}, {load[1]:.2f} on {os.cpu_count()} cores")
    if args.json:
        record = {"what": f"batched KV-cache decoding, {args.device}", "checkpoint": str(ck.path),
                  "recompute_tokens_per_s_batch_1": recompute,
                  "model": ck.cfg.to_dict(), "steps": args.steps, "prompt_len": args.prompt_len,
                  "rounds": args.rounds, "load_average_before_after": load,
                  "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
                  "date": time.strftime("%Y-%m-%d"),
                  "tables": [{"threads": t, "cuda_graph": g, "rows": r}
                             for (t, g), r in tables.items()]}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
