"""Matrix products for the CPU backend: single-threaded BLAS calls, split across our own pool.

NumPy's OpenBLAS keeps its own worker threads, which spin after each call. Beside Numba's
prange threads, and beside any other busy process, those spinning workers fight for the
same cores: measured on this project's 2-core machine with one other busy process, a
`small` training step took 967 ms with OpenBLAS's 2 threads and 259 ms with 1. So OpenBLAS
runs one thread per call, and a large product is cut by output rows into one piece per core,
computed concurrently by a small pool of Python threads (NumPy releases the GIL inside
BLAS) whose idle workers sleep instead of spinning.
"""

from __future__ import annotations

import ctypes
import re
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

# below this many multiply-adds a product runs whole on the calling thread: the hand-off
# to a worker (~30 us) would cost more than the split saves
SPLIT_MIN_MACS = 1 << 21

_SET_THREADS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                "openblas_set_num_threads")  # fmt: skip


def limit_blas_threads(n: int) -> bool:
    """Ask every loaded OpenBLAS for n threads per call; False if none could be found."""
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return False
    done = False
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        lib = ctypes.CDLL(path)
        for name in _SET_THREADS:
            if hasattr(lib, name):
                getattr(lib, name)(ctypes.c_int(n))
                done = True
                break
    return done


class SplitMatmul:
    """out = op(a) @ op(b), cut across `workers` threads by output rows or by the sum."""

    def __init__(self, workers: int | None = None):
        # as many pieces as Numba has threads (NUMBA_NUM_THREADS, else the cores), so that a
        # data-parallel rank given one thread also runs its products on one
        self.workers = workers or numba.config.NUMBA_NUM_THREADS
        # one BLAS thread per call only if we can say so; otherwise BLAS keeps its own pool
        # and splitting would oversubscribe the cores
        self.split = self.workers > 1 and limit_blas_threads(1)
        self.pool = ThreadPoolExecutor(self.workers - 1) if self.split else None
        self._partials: dict = {}  # (shape, dtype) -> the second half-sum of a K-split

    def __call__(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=)."""
        a2 = a.T if trans_a else a
        b2 = b.T if trans_b else b
        M, N = out.shape
        K = a2.shape[1]
        if M * N * K < SPLIT_MIN_MACS:
            _product(out, a2, b2, accumulate)
        elif trans_a:
            self._split_sum(out, a2, b2, accumulate)
        elif not self.split or M < 2 * 8:
            _product(out, a2, b2, accumulate)
        else:
            cuts = [M * i // self.workers for i in range(self.workers + 1)]
            jobs = [
                self.pool.submit(_product, out[r0:r1], a2[r0:r1], b2, accumulate)
                for r0, r1 in zip(cuts[1:-1], cuts[2:], strict=True)
            ]
            _product(out[: cuts[1]], a2[: cuts[1]], b2, accumulate)
            for job in jobs:
                job.result()

    def _split_sum(self, out, a2, b2, accumulate) -> None:
        """out (+)= a2[:, :h] @ b2[:h] + a2[:, h:] @ b2[h:], the halves concurrently.

        A weight gradient (trans_a: dW = X^T dY) has a small output and a long sum over the
        batch's tokens; its row pieces ran at 137 GFLOP/s against 163 for the two half-sums
        (682 x 2048 x 128 on this 2-core machine). Always two halves, whatever the thread
        count, so that the result's bits do not depend on it.
        """
        h = a2.shape[1] // 2
        key = (out.shape, out.dtype)
        if key not in self._partials:
            self._partials[key] = np.empty_like(out)
        part = self._partials[key]
        if self.split:
            job = self.pool.submit(_product, part, a2[:, h:], b2[h:], False)
            _product(out, a2[:, :h], b2[:h], accumulate)
            job.result()
        else:
            _product(part, a2[:, h:], b2[h:], False)
            _product(out, a2[:, :h], b2[:h], accumulate)
        out += part

    def pair(self, first, second) -> None:
        """Two independent products, each (out, a, b, trans_a, trans_b, accumulate), at once.

        The backward's products come in pairs of equal cost that read the same gradient,
        dX = dY W and dW = dY^T X: one whole single-threaded BLAS call per core beats two
        split calls, by 2% to 10% on this 2-core machine at the `small` shapes (one hand-off
        to the pool instead of two). Each product is computed whole whatever the thread
        count, so the results' bits do not depend on it.
        """
        if not self.split:
            _whole(*first)
            _whole(*second)
            return
        job = self.pool.submit(_whole, *second)
        _whole(*first)
        job.result()

    def map_blocks(self, fn, n: int) -> None:
        """fn(lo, hi) over `workers` blocks of range(n), concurrently; returns when all are done.

        fn must release the GIL for its heavy work (BLAS, nogil Numba kernels).
        """
        parts = self.workers if self.split else 1
        cuts = [n * i // parts for i in range(parts + 1)]
        blocks = [(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True) if hi > lo]
        jobs = [self.pool.submit(fn, lo, hi) for lo, hi in blocks[1:]]
        if blocks:
            fn(*blocks[0])
        for job in jobs:
            job.result()


def _whole(out, a, b, trans_a, trans_b, accumulate) -> None:
    _product(out, a.T if trans_a else a, b.T if trans_b else b, accumulate)


def _product(out, a, b, accumulate: bool) -> None:
    if accumulate:
        out += a @ b
    else:
        np.matmul(a, b, out=out)
