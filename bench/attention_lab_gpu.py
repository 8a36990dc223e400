"""Kernel lab: variants of the register-tiled FlashAttention, checked and timed side by side.

    python bench/attention_lab_gpu.py --out lab.json

Each variant sets attention_tiles' generation knobs (UNROLL: product steps per loop
iteration; LOAD_CHUNK: staging loads in flight; MIN_BLOCKS: launch bound, which caps
registers at 65536 / (128 MIN_BLOCKS); UNSIGNED_OFFSETS: shared-memory offsets without
numba's negative-index test; ATOMIC_DQ: dQ added with atomics by the key-tile kernel),
rebuilds the kernels, checks forward and backward
against the one-row-per-thread kernels and times them (B=32, H=12, G=4, E=64, causal).
The package keeps only the winner's settings as its defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import timed  # noqa: E402

from euler.gpu import attention, attention_tiles  # noqa: E402
from euler.gpu.backend import GpuBackend  # noqa: E402

# (UNROLL, LOAD_CHUNK, MIN_BLOCKS, UNSIGNED_OFFSETS, ATOMIC_DQ); the first is the default.
# Measured 2026-11-29 (before ATOMIC_DQ): unsigned 0.76 / 2.86 ms (fwd / bwd), signed
# 1.37 / 5.21 ms.
VARIANTS = [
    (8, 8, 0, True, True),
    (8, 8, 0, True, False),
    (8, 8, 4, True, True),
    (4, 8, 0, True, True),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", type=int, default=len(VARIANTS), help="first N variants")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    be = GpuBackend(tf32=True)
    B, T, H, G, E = args.batch, args.T, 12, 4, 64
    rng = np.random.default_rng(0)
    qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
    dout = be.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
    out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
    dqkv, dsum = be.zeros((B, T, (H + 2 * G) * E), np.float32), be.zeros((B, H, T), np.float32)
    s = be.stream
    tile = attention.tile_for(E)
    attention.attention_forward(out, lse, qkv, H, G, E, s, tile)
    attention.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, s, tile)
    ref_out, ref_lse, ref_dqkv = be.to_host(out), be.to_host(lse), be.to_host(dqkv)
    useful = 4 * B * H * T * T * E / 2
    rows = []
    for unroll, chunk, min_blocks, unsigned, atomic_dq in VARIANTS[: args.variants]:
        attention_tiles.UNROLL, attention_tiles.LOAD_CHUNK = unroll, chunk
        attention_tiles.MIN_BLOCKS, attention_tiles.UNSIGNED_OFFSETS = min_blocks, unsigned
        attention_tiles.ATOMIC_DQ = atomic_dq
        fwd = lambda: attention.attention_forward(out, lse, qkv, H, G, E, s)  # noqa: E731
        bwd = lambda: attention.attention_backward(  # noqa: E731
            dqkv, dout, qkv, out, lse, H, G, E, dsum, s
        )
        fwd()
        bwd()
        err = max(
            float(np.abs(be.to_host(out) - ref_out).max()),
            float(np.abs(be.to_host(lse) - ref_lse).max()),
            float(np.abs(be.to_host(dqkv) - ref_dqkv).max()),
        )
        f_ms, b_ms = timed(be, fwd, args.reps), timed(be, bwd, args.reps)
        regs = [k.regs_per_thread for d in attention_tiles.kernels(E) for k in d.overloads.values()]
        row = {
            "unroll": unroll,
            "load_chunk": chunk,
            "min_blocks": min_blocks,
            "unsigned_offsets": unsigned,
            "atomic_dq": atomic_dq,
            "fwd_ms": f_ms,
            "bwd_ms": b_ms,
            "fwd_tflops": useful / f_ms / 1e9,
            "bwd_over_fwd": b_ms / f_ms,
            "registers_fwd_(dq)_dkv": regs,
            "max_abs_diff_vs_one_row_kernels": err,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"B": B, "T": T, "H": H, "G": G, "E": E, "rows": rows}))


if __name__ == "__main__":
    main()
