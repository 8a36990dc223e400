"""Ablations of the tensor-core forward: where a block's fixed cost goes (timed, not checked).

    python bench/labs/attention_tc_ablation.py [--T 512] [--out ablation.json]

Session 8 fit the forward's launch-free time over T = 128..2048 as 0.0081 us a key tile
plus 0.018 us a block (bench/notes_gpu.md). So a block costs as much as 2.2 tiles: a third
of the forward at T=512. More warps (KV_SPLIT) and persistent blocks (PERSISTENT) did not
remove it.

Each ablation removes one per-block part from the generated default forward and times
what is left, launch-free (bench/gpu_timing.timed). Its outputs are wrong by design, so
nothing is checked:
- no-q-stage: Q's staging loads and stores (its fragments read whatever shared memory
  holds);
- no-store: the output and lse stores, behind a test the compiler cannot decide
  (scale < 0);
- no-mask: the diagonal tile's causal mask, the same way.

The forward ablated is the one those parts were measured on (2026-11-30, results
ablation-*): ASYNC_Q and STAGED_OUT off, Q staged through registers and the output stored
from the C fragments. Both knobs came of these figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import attention_tc  # noqa: E402
from euler.gpu.approx import LOG2E  # noqa: E402

NEVER = "scale < T(0.0)"  # false at run time (scale > 0), unknown to the compiler


def ablations(src: str) -> dict[str, str]:
    """The default forward's source and each ablation of it, by name."""
    lines = src.splitlines()

    def edit(keep, change=lambda line: line) -> str:
        return "\n".join(change(line) for line in lines if keep(line.strip())) + "\n"

    staging = ("v0_", "sm[sb0")  # Q's loads to registers, then their stores (_Gen.stage)
    return {
        "default": src,
        "no-q-stage": edit(lambda s: not s.startswith(staging)),
        "no-store": edit(
            lambda s: True,
            lambda line: (
                line.replace("< Tn:", f"< Tn and {NEVER}:")
                if line.strip().startswith("if r0 +")
                else line
            ),
        ),
        "no-mask": edit(
            lambda s: True, lambda line: line.replace("if j0 == i0:", f"if j0 == i0 and {NEVER}:")
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from euler.gpu.backend import GpuBackend

    be = GpuBackend(tf32=True)
    s = be.stream
    B, T, H, G, E = args.batch, args.T, 12, 4, 64
    rng = np.random.default_rng(0)
    qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
    out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
    scale = np.float32(LOG2E / math.sqrt(E))  # as attention_forward with FAST_EXP
    grid = attention_tc._grid((T + 63) // 64, B * H, attention_tc.HEAVY_FIRST_FORWARD)
    nbytes = attention_tc.shared_bytes(E)["forward"]
    rows = []
    attention_tc.ASYNC_Q = attention_tc.STAGED_OUT = False  # the forward these parts were of
    for name, src in ablations(attention_tc.sources(E)["forward_tc_kernel"]).items():
        kernel = attention_tc._compile("forward_tc_kernel", src)  # the knobs' imports

        def call(kernel=kernel) -> None:
            attention_tc._launch(kernel, grid, s, nbytes, out, lse, qkv, H, G, scale)

        call()
        rows.append({"ablation": name, "B": B, "T": T, "fwd_ms": timed(s, call, args.reps)})
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
