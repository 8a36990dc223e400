"""Which cuts of a product keep its bits: blocks of rows or columns against the whole.

    python bench/labs/cpu_product_bits.py

OpenBLAS picks its kernel by a call's sizes (a one-row call is a gemv; small calls may take a
small-matrix or a direct kernel that packs nothing), so a product cut into blocks can differ
in its last bits from the whole. For each product shape of the small and gpu presets' steps,
and for both transposes, this cuts the rows (then the columns) into 2 to 32 blocks whose
edges fall on multiples of ALIGN, computes each block with one single-threaded sgemm, and
prints one JSON line per (shape, cut) that differs from the whole, with the smallest
block's multiply-adds; then a summary: the smallest block of a cut that differed and of
one that agreed, and OpenBLAS's kernel family on this CPU.
"""

from __future__ import annotations

import json
import platform

import numpy as np

from euler.cpu import blas

ALIGN = 64
SHAPES = [  # (M, N, K, trans_a, trans_b) as euler.cpu.blas.Products takes them
    *[(2048, n, k, False, True) for n, k in [(128, 128), (256, 128), (682, 128), (128, 341),
                                             (512, 128), (128, 64)]],
    *[(2048, n, k, False, False) for n, k in [(128, 512), (128, 682), (128, 128), (128, 256),
                                              (128, 341)]],
    *[(m, n, 2048, True, False) for m, n in [(128, 128), (682, 128), (512, 128), (128, 341),
                                             (256, 128)]],
    (2048, 768, 768, False, True), (2048, 768, 2048, False, False), (2048, 4096, 768, False, True),
    (768, 2048, 2048, True, False), (300, 77, 1000, False, False), (192, 96, 80, False, False),
]  # fmt: skip


def product(a, b, trans_a, trans_b):
    return np.matmul(a.T if trans_a else a, b.T if trans_b else b)


def edges(n: int, blocks: int) -> list[int]:
    """Block edges over n, each on a multiple of ALIGN (blocks may merge)."""
    return sorted({min(n, i * n // blocks // ALIGN * ALIGN) for i in range(blocks)} | {n})


def main() -> None:
    blas.set_blas_threads(1)
    rng = np.random.default_rng(0)
    agreed, differed = None, None
    for M, N, K, ta, tb in SHAPES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        whole = product(a, b, ta, tb)
        for axis in ("rows", "columns"):
            for blocks in (2, 4, 8, 16, 32):
                cut = edges(M if axis == "rows" else N, blocks)
                out = np.empty_like(whole)
                smallest = None
                for lo, hi in zip(cut[:-1], cut[1:], strict=True):
                    if axis == "rows":
                        out[lo:hi] = product(a[:, lo:hi] if ta else a[lo:hi], b, ta, tb)
                        macs = (hi - lo) * N * K
                    else:
                        out[:, lo:hi] = product(a, b[lo:hi] if tb else b[:, lo:hi], ta, tb)
                        macs = M * (hi - lo) * K
                    smallest = macs if smallest is None else min(smallest, macs)
                if np.array_equal(out, whole):
                    agreed = smallest if agreed is None else min(agreed, smallest)
                else:
                    differed = smallest if differed is None else min(differed, smallest)
                    diff = float(np.abs(out - whole).max())
                    print(json.dumps({"shape": [M, N, K], "trans_a": ta, "trans_b": tb,
                                      "axis": axis, "edges": cut, "smallest_block_macs": smallest,
                                      "max_abs_diff": diff}))  # fmt: skip
    print(json.dumps({"summary": True, "cpu": platform.machine(), "openblas_core": blas.core_name(),
                      "smallest_block_that_differed": differed,
                      "smallest_block_that_agreed": agreed}))  # fmt: skip


if __name__ == "__main__":
    main()
