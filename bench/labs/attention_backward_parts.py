"""The tensor-core backward's parts, timed alone on a GPU (launch-free, not checked).

    python bench/labs/attention_backward_parts.py [--T 512,2048] [--out parts.json]

Session 8 fit the backward at T=512 as 0.0216 us per (key tile, query tile, head) plus a
term linear in T, 35% of it (bench/notes_gpu.md), which holds the prep kernel (D =
rowsum(dO O) and dQ's zeros) and the dkv blocks' own staging and stores. This times, at
B=32, H=12, G=4, E=64 (bench/gpu_timing.timed, 10 calls back to back):

- prep: attention.backward_prep (named "prep vector" in the results of session 9, when a
  1-d grid of 16-byte chunks took 0.059 ms at T=512; the 4-byte kernel of a warp a row
  before it took 0.126 ms at T=512, 0.494 at 2048: results
  attention-tc-backward-parts-launchfree-2026-11-30-h200.json; a split of it into a
  zeroing kernel and a reading one, 0.101 and 0.379: -s9d-prep-split-.)
- dkv: the dkv kernel alone (compiled without PREP_BLOCKS, the prep kernel's partner), and
  with its dQ atomics behind a test the compiler cannot decide (scale < 0: the products
  stay, the adds go; its dQ is wrong by design; the results of 2026-11-30 14:28 UTC,
  session 13, left FLAT's adds in: parts-s13-*);
- backward: attention_tc.attention_backward whole, and the forward for the ratio;
- prep blocks alone: PREP_BLOCKS's first grid row without the dkv blocks (grid (B G, 1)):
  how long its B G blocks take to do the prep kernel's work.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import lengths_parser, timed  # noqa: E402
from bench.labs.attention_tc_ablation import NEVER  # noqa: E402
from euler.gpu import attention, attention_tc  # noqa: E402


def no_atomics(src: str) -> str:
    """The dkv source with each of dQ's atomic adds guarded by NEVER (the clamped rows' tests
    and FLAT's whole-tile one)."""

    def guarded(line: str) -> str:
        if line.strip().startswith("if rq +"):
            return line.replace("< Tn:", f"< Tn and {NEVER}:")
        return line.replace("if whole:", f"if whole and {NEVER}:")

    return "\n".join(guarded(line) for line in src.splitlines()) + "\n"


def dkv_kernel(prep_blocks: bool, edit=lambda src: src):
    """The dkv kernel compiled with PREP_BLOCKS set as given (apart from the module's
    defaults), its source passed through edit first."""
    name, saved = "backward_dkv_tc_kernel", attention_tc.PREP_BLOCKS
    attention_tc.PREP_BLOCKS = prep_blocks
    try:
        return attention_tc._compile(name, edit(attention_tc.sources(64)[name]))
    finally:
        attention_tc.PREP_BLOCKS = saved


def calls_at(be, B: int, T: int, dkv, dkv_ablated, prep_blocks) -> dict:
    """Each part's call on random data of batch B, length T, by name."""
    s, H, G, E = be.stream, 12, 4, 64
    rng = np.random.default_rng(0)
    qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
    dout = be.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
    out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
    dqkv, dsum = be.zeros(qkv.shape, np.float32), be.zeros((B, H, T), np.float32)
    scale = np.float32(1.0 / math.sqrt(E))
    grid = attention_tc._grid((T + 63) // 64, B * G, attention_tc.HEAVY_FIRST)
    nbytes = attention_tc.shared_bytes(E)["dkv"]
    args = (dqkv, dsum, dout, qkv, lse, H, G, scale)
    return {
        "forward": lambda: attention_tc.attention_forward(out, lse, qkv, H, G, E, s),
        "backward": lambda: attention_tc.attention_backward(
            dqkv, dout, qkv, out, lse, H, G, E, dsum, s
        ),
        "prep": lambda: attention.backward_prep(dqkv, dsum, dout, out, H, E, s),
        "dkv": lambda: attention_tc._launch(dkv, grid, s, nbytes, *args),
        "dkv no atomics": lambda: attention_tc._launch(dkv_ablated, grid, s, nbytes, *args),
        "prep blocks alone": lambda: attention_tc._launch(
            prep_blocks,
            (grid[0], 1),
            s,
            nbytes,
            *args,
            out,
            attention_tc._flags(B * H * grid[1], s),
            1,
        ),
    }


def main() -> None:
    args = lengths_parser(__doc__).parse_args()
    from euler.gpu.backend import GpuBackend

    be = GpuBackend(tf32=True)
    dkv, dkv_ablated = dkv_kernel(False), dkv_kernel(False, no_atomics)
    prep_blocks = dkv_kernel(True)
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        parts = calls_at(be, args.batch, T, dkv, dkv_ablated, prep_blocks)
        for part, call in parts.items():
            call()
            rows.append(
                {"part": part, "B": args.batch, "T": T, "ms": timed(be.stream, call, args.reps)}
            )
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
