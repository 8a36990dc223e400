"""The decoder's product out = x w^T over its shapes: warps of R rows, W warps a block.

    python bench/labs/decode_linear_gpu.py [--rows 1,8,32] [--reps 5] [--out linear.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/decode_linear_gpu.py --rows 3 --shapes 70x5 \
        --check-only

The package's kernels (euler.gpu.decode): linear_element_kernel gives an output element to
one warp, a block of one warp, each row reading the whole weight again; linear_kernel(R, W)
gives a warp one feature m for R rows at once, each weight element loaded once and
multiplied into R sums, with W warps a block. linear_rows takes the element kernel at one
row and linear_shape(n) beyond. Each row's sum is taken in the same order by every kernel
(lane l's strided partial, then the butterfly), so every variant's outputs must be the
element kernel's bit for bit: the lab checks it before timing.

The variant here (`tile F x R x W`) gives a warp F features for R rows: each step of a lane
loads F weight elements and R row elements for F R products, where linear_kernel loads 1
and R for R (at batch 32 its products reach 0.16 TB/s of weights, loads of x bounding them).

Timed launch-free (bench/gpu_timing.timed) at the `gpu` preset's products, D x M: qkv
768 x 1280, attention output 768 x 768, gate and up 768 x 4096, down 2048 x 768.
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
VARIANTS = ((1, 1), (2, 4), (4, 4), (8, 4), (8, 8))  # (R, W)
TILES = ((2, 4, 4), (2, 8, 4), (4, 4, 4), (4, 8, 4))  # (F, R, W)


@cache
def tile_kernel(F: int, R: int, W: int):
    """out (n, M) = x (n, D) @ w (M, D)^T, assigned: warp job j = block f * groups + group
    computes features f F .. f F + F - 1 of rows group R .. group R + R - 1 (M % F == 0)."""
    threads, FR = W * WARP, F * R

    @cuda.jit
    def linear_tile_kernel(out, x, w):
        n, D = x.shape
        M = w.shape[0]
        buf = cuda.shared.array(threads, float32)
        s = cuda.local.array(FR, float32)
        wv = cuda.local.array(F, float32)
        lane = cuda.threadIdx.x % WARP
        groups = (n + R - 1) // R
        jobs = groups * (M // F)
        base = cuda.blockIdx.x * W
        while base < jobs:  # the same for the whole block
            job = base + cuda.threadIdx.x // WARP
            f0 = job // groups * F
            i0 = (job - job // groups * groups) * R
            for k in range(FR):
                s[k] = float32(0.0)
            if job < jobs:
                for d in range(lane, D, WARP):
                    for a in range(F):
                        wv[a] = w[f0 + a, d]
                    for k in range(R):
                        if i0 + k < n:
                            xv = x[i0 + k, d]
                            for a in range(F):
                                s[a * R + k] += xv * wv[a]
            for a in range(F):
                for k in range(R):
                    t = warp_sum_all(s[a * R + k], buf, float32(0.0))
                    if lane == 0 and job < jobs and i0 + k < n:
                        out[i0 + k, f0 + a] = t
            base += cuda.gridDim.x * W

    return linear_tile_kernel


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
            grid1 = grid_for(n * M, 1)
            decode.linear_element_kernel[grid1, WARP, stream](want, x, w)

            def package(out=got, x=x, w=w):
                decode.linear_rows(out, x, w, stream)

            def element(out=got, x=x, w=w, grid=grid1):
                decode.linear_element_kernel[grid, WARP, stream](out, x, w)

            shape = "element" if n == 1 else decode.linear_shape(n)
            calls = [(f"package {shape}", package), ("element", element)]
            for R, W in VARIANTS:
                groups = (n + R - 1) // R
                grid, kernel = grid_for(groups * M, W), decode.linear_kernel(R, W)

                def variant(out=got, x=x, w=w, k=kernel, grid=grid, W=W):
                    k[grid, W * WARP, stream](out, x, w)

                calls.append((f"rows {R} x {W}", variant))
            for F, R, W in TILES:
                if M % F:
                    continue
                jobs = (n + R - 1) // R * (M // F)
                grid, kernel = grid_for(jobs, W), tile_kernel(F, R, W)

                def tile(out=got, x=x, w=w, k=kernel, grid=grid, W=W):
                    k[grid, W * WARP, stream](out, x, w)

                calls.append((f"tile {F} x {R} x {W}", tile))
            for name, call in calls:
                got[:] = 0
                call()
                stream.synchronize()
                if got.copy_to_host().tobytes() != want.copy_to_host().tobytes():
                    raise SystemExit(f"{name} at n={n}, {D}x{M}: not the element kernel's bits")
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
