"""The decoder's product out = x w^T: the package's warp an element against warps of R rows.

    python bench/labs/decode_linear_gpu.py [--rows 1,8,32] [--reps 5] [--out linear.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/decode_linear_gpu.py --rows 3 --shapes 70x5 \
        --check-only

The package (euler.gpu.decode.linear_kernel) gives each output element (row i, feature m)
to one warp, a block of one warp: every row reads the whole weight again (from L2 when it
fits) and a multiprocessor holds 32 such blocks, half its warps. The variant here
(`rows R x W`) gives a warp one feature m for R rows at once, each weight element loaded
once and multiplied into R sums, with W warps a block (the block's warps take the same
number of jobs, as the simulator's reductions need). Each row's sum is taken in the
package's order (lane l's strided partial, then the butterfly), so the outputs must be
the package's bit for bit: the lab checks it before timing.

Timed launch-free (bench/gpu_timing.timed) at the `gpu` preset's products, D x M: qkv
768 x 1280, attention output 768 x 768, gate and up 768 x 4096, down 2048 x 768, a head
768 x 4096.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import decode  # noqa: E402
from euler.gpu.memory import grid_for  # noqa: E402
from euler.gpu.reduce import WARP, warp_sum_all  # noqa: E402

SHAPES = "768x1280,768x768,768x4096,2048x768"  # D x M
VARIANTS = ((1, 4), (2, 4), (4, 4), (8, 4), (8, 8))  # (R, W)


@cache
def rows_kernel(R: int, W: int):
    """out (n, M) = x (n, D) @ w (M, D)^T: warp w of a block takes job (block job + w),
    job = m * groups + group, rows group R .. group R + R - 1 of feature m."""

    @cuda.jit
    def kernel(out, x, w):
        n, D = x.shape
        M = w.shape[0]
        buf = cuda.shared.array(W * WARP, float32)
        s = cuda.local.array(R, float32)
        lane = cuda.threadIdx.x % WARP
        groups = (n + R - 1) // R
        base = cuda.blockIdx.x * W
        while base < groups * M:  # the same for the whole block
            job = base + cuda.threadIdx.x // WARP
            m = job // groups
            i0 = (job - m * groups) * R
            for k in range(R):
                s[k] = float32(0.0)
            if job < groups * M:
                for d in range(lane, D, WARP):
                    wv = w[m, d]
                    for k in range(R):
                        if i0 + k < n:
                            s[k] += x[i0 + k, d] * wv
            for k in range(R):
                t = warp_sum_all(s[k], buf, float32(0.0))
                if lane == 0 and job < groups * M and i0 + k < n:
                    out[i0 + k, m] = t
            base += cuda.gridDim.x * W

    return kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--shapes", default=SHAPES, help="D x M, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--check-only", action="store_true", help="compare, do not time")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream, rows = cuda.stream(), []
    rng = np.random.default_rng(0)
    for n in map(int, args.rows.split(",")):
        for shape in args.shapes.split(","):
            D, M = map(int, shape.split("x"))
            x = cuda.to_device(rng.standard_normal((n, D)).astype(np.float32))
            w = cuda.to_device(rng.standard_normal((M, D)).astype(np.float32))
            want = cuda.to_device(np.zeros((n, M), np.float32))
            got = cuda.to_device(np.zeros((n, M), np.float32))

            def package(out=want, x=x, w=w):
                decode.linear_rows(out, x, w, stream)

            package()
            calls = [("package", package)]
            for R, W in VARIANTS:
                groups = (n + R - 1) // R
                grid, kernel = grid_for(groups * M, W), rows_kernel(R, W)

                def variant(out=got, x=x, w=w, k=kernel, grid=grid, W=W):
                    k[grid, W * WARP, stream](out, x, w)

                got[:] = 0
                variant()
                stream.synchronize()
                if got.copy_to_host().tobytes() != want.copy_to_host().tobytes():
                    raise SystemExit(f"rows {R} x {W} at n={n}, {D}x{M}: not the package's bits")
                calls.append((f"rows {R} x {W}", variant))
            for name, call in calls:
                ms = None if args.check_only else timed(stream, call, args.reps)
                gbytes = 4 * (M * D + n * D + n * M) / 1e9
                rec = {"variant": name, "rows": n, "D": D, "M": M, "us": ms and ms * 1e3,
                       "weight_tb_per_s": ms and gbytes / ms}  # fmt: skip
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
