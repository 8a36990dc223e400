"""Does OpenBLAS compute a step's products faster in small tiles than whole, on one core?

    OPENBLAS_CORETYPE=SKYLAKEX taskset -c 0 python bench/labs/cpu_blas_tiles.py --reps 30

OpenBLAS's AVX-512 build (SkylakeX) has two paths that skip its packing copies: a "small
matrix" kernel, taken when M N K <= 10^6 (not for X^T dY unless its output is tiny), and
a "direct" sgemm, taken for an untransposed row-major product with beta = 0 and M N K
below 28 x 512^2. The package's blocks are at least 2^20 multiply-adds, so its products
always take the packed path. This lab times each product of the `small` step (B T = 2048
rows) whole and as a serial loop of row x column tiles of each size given, on one thread,
and prints one JSON line of GFLOP/s per shape and tile; a tile that wins for every shape
would be a plan for the package (a cut by the shapes alone keeps the bits at any thread
count).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from numba import njit

sys.path.insert(0, str(Path(__file__).parent))
from cpu_blas_cores import shapes  # noqa: E402  (loads NumPy before euler: env's family)
from cpu_products import timed  # noqa: E402

from euler.blas_kernels import core_name  # noqa: E402
from euler.cpu.blas import gemm  # noqa: E402


@njit(cache=True)
def _tiled(out, a, b, ta, tb, tr, tc):
    """out = op(a) @ op(b) as a serial loop of tr x tc tiles of out (one call each)."""
    M, N = out.shape
    K = a.shape[0] if ta else a.shape[1]
    lda, ldb = a.shape[1], b.shape[1]
    item = 4
    for r0 in range(0, M, tr):
        r1 = min(M, r0 + tr)
        for c0 in range(0, N, tc):
            c1 = min(N, c0 + tc)
            pa = a.ctypes.data + item * (r0 if ta else r0 * lda)
            pb = b.ctypes.data + item * (c0 * ldb if tb else c0)
            pc = out.ctypes.data + item * (r0 * N + c0)
            gemm(r1 - r0, c1 - c0, K, pa, lda, pb, ldb, 0.0, pc, N, False, trans_a=ta, trans_b=tb)


def main(
    reps: Annotated[int, typer.Option(help="timed calls a shape and tile")] = 30,
    tiles: Annotated[str, typer.Option(help="rows x columns of each tile, comma-separated")] = (
        "64x64,64x120,32x128,128x64,32x256,64x256,128x128,256x128,512x128"
    ),
    preset: Annotated[str, typer.Option()] = "small",
) -> None:
    """Print GFLOP/s per product shape (whole and each tile) on this process's one thread."""
    rng = np.random.default_rng(0)
    result = {"core": core_name(), "coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
              "preset": preset, "gflops": {}}  # fmt: skip
    sizes = [tuple(int(x) for x in t.split("x")) for t in tiles.split(",")]
    for weight, M, N, K, ta, tb in shapes(preset):
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        out = np.empty((M, N), np.float32)
        layout = "tn" if ta else ("nt" if tb else "nn")
        name = f"{weight} {layout} {M}x{N}x{K}"
        flop = 2.0 * M * N * K
        row = {"whole": flop / timed(partial(_tiled, out, a, b, ta, tb, M, N), reps) / 1e9}
        want = (a.T if ta else a) @ (b.T if tb else b)
        for tr, tc in sizes:
            s = timed(partial(_tiled, out, a, b, ta, tb, tr, tc), reps)
            assert np.allclose(out, want, rtol=1e-3, atol=1e-2), (name, tr, tc)
            row[f"{tr}x{tc}"] = flop / s / 1e9
        result["gflops"][name] = {k: round(v, 1) for k, v in row.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    typer.run(main)
