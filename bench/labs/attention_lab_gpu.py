"""Kernel lab: variants of the register-tiled (exact fp32) FlashAttention, checked and timed.

    python bench/labs/attention_lab_gpu.py --out lab.json [--T 512 2048]

Each variant is an attention_exact_tiles.TileOptions (kstep: k steps written out per loop
iteration of a product, which sets how many operands ptxas hoists and so the registers).
Its kernels, launched by that lab's launchers, are checked forward and backward against
the readable kernels (euler/gpu/attention.py) and timed launch-free (bench/gpu_timing.py:
rounds of calls back to back behind a spin) at B=32, H=12, G=4, E=64, causal. TFLOP/s count
the useful causal work, 4 B H T^2 E / 2 forward. TileOptions' defaults are the winner's.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from bench.labs import attention_exact_tiles as attention_tiles  # noqa: E402
from euler.gpu import attention  # noqa: E402
from euler.gpu.backend import GpuBackend  # noqa: E402

# The first is the default. ptxas (sm_90, E = 64): kstep 8 -> 248 and 254 registers
# (forward, dkv), 4 -> 167 and 254; the forward fits 3 blocks a multiprocessor under 168,
# the dkv's shared memory (107 KB) 2 whatever its registers. A launch bound of 3 blocks
# (160 and 168 registers, the dkv spilling 212 bytes) timed as kstep 4 did, so the
# generator sets none. H200, T=512: 8 -> 0.459 and 1.117 ms, 4 -> 0.467 and 1.156
# (results/attention-exact-fp32-h200-2026-11-30.json, `variants`).
VARIANTS = [attention_tiles.TileOptions(), attention_tiles.TileOptions(kstep=4)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", type=int, default=len(VARIANTS), help="first N variants")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    be = GpuBackend(tf32=True)
    s = be.stream
    rows = []
    for T in args.T:
        B, H, G, E = args.batch, 12, 4, 64
        rng = np.random.default_rng(0)
        qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
        dout = be.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
        out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
        dqkv = be.zeros((B, T, (H + 2 * G) * E), np.float32)
        dsum = be.zeros((B, H, T), np.float32)
        attention.attention_forward(out, lse, qkv, H, G, E, s)
        attention.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, s)
        ref_out, ref_lse, ref_dqkv = be.to_host(out), be.to_host(lse), be.to_host(dqkv)
        useful = 4 * B * H * T * T * E / 2
        for opts in VARIANTS[: args.variants]:
            fwd = partial(attention_tiles.attention_forward, out, lse, qkv, H, G, E, s, opts)
            bwd = partial(
                attention_tiles.attention_backward,
                dqkv,
                dout,
                qkv,
                out,
                lse,
                H,
                G,
                E,
                dsum,
                s,
                opts,
            )
            fwd()
            bwd()
            err = {
                "out": float(np.abs(be.to_host(out) - ref_out).max()),
                "lse": float(np.abs(be.to_host(lse) - ref_lse).max()),
                "dqkv": float(np.abs(be.to_host(dqkv) - ref_dqkv).max()),
            }
            f_ms, b_ms = timed(s, fwd, args.reps), timed(s, bwd, args.reps)
            built = attention_tiles.kernels(E, opts)
            regs = [k.regs_per_thread for d in built for k in d.overloads.values()]
            row = {
                "T": T,
                "kstep": opts.kstep,
                "fwd_ms": f_ms,
                "bwd_ms": b_ms,
                "fwd_tflops": useful / f_ms / 1e9,
                "bwd_over_fwd": b_ms / f_ms,
                "registers_fwd_dkv": regs,
                "max_abs_diff_vs_readable_kernels": err,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps({"B": B, "H": H, "G": G, "E": E, "rows": rows}))


if __name__ == "__main__":
    main()
