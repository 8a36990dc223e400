"""The decoder's product out = x w^T over its shapes: warps of F features by R rows.

    python bench/labs/decode_linear_gpu.py [--rows 1,8,32] [--reps 5] [--out linear.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/decode_linear_gpu.py --rows 3 --shapes 72x8 \
        --check-only

The package's kernels (euler.gpu.decode): linear_element_kernel gives an output element to
one warp, a block of one warp, each row reading the whole weight again; linear_kernel(F,
R, W) gives a warp F features of R rows, each lane loading F weight and R row elements a
step for F R products, with W warps a block. linear_rows takes the element kernel at one
row and linear_shape(n, M) beyond. Each row's sum is taken in the same order by every
kernel (lane l's strided partial, then the butterfly), so every variant's outputs must be
the element kernel's bit for bit: the lab checks it before timing.

Timed launch-free (bench/gpu_timing.timed) at the `gpu` preset's products, D x M: qkv
768 x 1280, attention output 768 x 768, gate and up 768 x 4096, down 2048 x 768. On an H200
(2026-12-03) the variants of 2 and 4 features beat
one feature at batch 32 on every shape (the step's products 2.05 ms with 4 x 4 x 4 against
3.18 with 1 x 8 x 4), and at batch 8 on two shapes of four.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import decode  # noqa: E402
from euler.gpu.memory import grid_for  # noqa: E402
from euler.gpu.reduce import WARP  # noqa: E402

SHAPES = "768x1280,768x768,768x4096,2048x768"  # D x M
# (F, R, W): one feature for R rows, then F features for R rows
VARIANTS = ((1, 1, 1), (1, 2, 4), (1, 4, 4), (1, 8, 4), (1, 8, 8),
            (2, 4, 4), (2, 8, 4), (4, 4, 4), (4, 8, 4))  # fmt: skip


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

            shape = "element" if n == 1 else decode.linear_shape(n, M)
            calls = [(f"package {shape}", package), ("element", element)]
            for F, R, W in VARIANTS:
                if M % F:
                    continue
                jobs = (n + R - 1) // R * (M // F)
                grid, kernel = grid_for(jobs, W), decode.linear_kernel(F, R, W)

                def variant(out=got, x=x, w=w, k=kernel, grid=grid, W=W):
                    k[grid, W * WARP, stream](out, x, w)

                calls.append((f"{F} x {R} x {W}", variant))
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
