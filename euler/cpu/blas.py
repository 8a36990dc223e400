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
    """out = op(a) @ op(b), cut by output rows across `workers` threads."""

    def __init__(self, workers: int | None = None):
        # as many pieces as Numba has threads (NUMBA_NUM_THREADS, else the cores), so that a
        # data-parallel rank given one thread also runs its products on one
        self.workers = workers or numba.config.NUMBA_NUM_THREADS
        # one BLAS thread per call only if we can say so; otherwise BLAS keeps its own pool
        # and splitting would oversubscribe the cores
        self.split = self.workers > 1 and limit_blas_threads(1)
        self.pool = ThreadPoolExecutor(self.workers - 1) if self.split else None

    def __call__(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=)."""
        a2 = a.T if trans_a else a
        b2 = b.T if trans_b else b
        M = out.shape[0]
        if not self.split or M * out.shape[1] * a2.shape[1] < SPLIT_MIN_MACS or M < 2 * 8:
            _product(out, a2, b2, accumulate)
            return
        cuts = [M * i // self.workers for i in range(self.workers + 1)]
        jobs = [
            self.pool.submit(_product, out[r0:r1], a2[r0:r1], b2, accumulate)
            for r0, r1 in zip(cuts[1:-1], cuts[2:], strict=True)
        ]
        _product(out[: cuts[1]], a2[: cuts[1]], b2, accumulate)
        for job in jobs:
            job.result()


def _product(out, a, b, accumulate: bool) -> None:
    if accumulate:
        out += a @ b
    else:
        np.matmul(a, b, out=out)
