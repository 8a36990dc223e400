"""Matrix products for the CPU backend: single-threaded BLAS calls, split across our own pool.

NumPy's OpenBLAS keeps its own worker threads, which spin after each call. Beside Numba's
prange threads, and beside any other busy process, those spinning workers fight for the
same cores: measured on this project's 2-core machine with one other busy process, a
`small` training step took 967 ms with OpenBLAS's 2 threads and 259 ms with 1. So OpenBLAS
runs one thread per call, and a large product is cut by output rows into one piece per core,
computed concurrently by a small pool of Python threads (NumPy releases the GIL inside
BLAS) whose idle workers sleep instead of spinning.

The pool is a thread per worker fed through two locks: a hand-off and the wait for it took
about 25 us against 50 to 70 us through concurrent.futures, and a `small` step makes about
fifty of them.
"""

from __future__ import annotations

import ctypes
import re
import threading

import numba
import numpy as np

# below this many multiply-adds a product runs whole on the calling thread: the hand-off
# to a worker (~25 us) would cost more than the split saves
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


class _Worker:
    """One daemon thread that runs a job at a time; two locks serve as binary semaphores."""

    def __init__(self):
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._job = None
        self._error = None
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            fn, args = self._job
            try:
                fn(*args)
            except BaseException as e:  # handed to the caller of wait()
                self._error = e
            self._done.release()

    def submit(self, fn, *args) -> None:
        self._job = (fn, args)
        self._go.release()

    def wait(self) -> BaseException | None:
        """Block until the job is done; return what it raised, if anything."""
        self._done.acquire()
        error, self._error = self._error, None
        return error


class SplitMatmul:
    """out = op(a) @ op(b), cut across `workers` threads by output rows or by the sum."""

    def __init__(self, workers: int | None = None):
        # as many pieces as Numba has threads (NUMBA_NUM_THREADS, else the cores), so that a
        # data-parallel rank given one thread also runs its products on one
        self.workers = workers or numba.config.NUMBA_NUM_THREADS
        # one BLAS thread per call only if we can say so; otherwise BLAS keeps its own pool
        # and splitting would oversubscribe the cores
        self.split = self.workers > 1 and limit_blas_threads(1)
        self._pool = [_Worker() for _ in range(self.workers - 1)] if self.split else []
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
            self._run(
                [(_product, (out[r0:r1], a2[r0:r1], b2, accumulate))
                 for r0, r1 in zip(cuts[:-1], cuts[1:], strict=True)]
            )  # fmt: skip

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
        self._run(
            [(_product, (out, a2[:, :h], b2[:h], accumulate)),
             (_product, (part, a2[:, h:], b2[h:], False))]
        )  # fmt: skip
        out += part

    def pair(self, first, second) -> None:
        """Two independent products, each (out, a, b, trans_a, trans_b, accumulate), at once.

        The backward's products come in pairs of equal cost that read the same gradient,
        dX = dY W and dW = dY^T X: one whole single-threaded BLAS call per core beats two
        split calls, by 2% to 10% on this 2-core machine at the `small` shapes (one hand-off
        to the pool instead of two). Each product is computed whole whatever the thread
        count, so the results' bits do not depend on it.
        """
        self._run([(_whole, first), (_whole, second)])

    @property
    def threads(self) -> int:
        """How many calls map_blocks runs at once."""
        return self.workers if self.split else 1

    def map_blocks(self, fn, n: int) -> None:
        """fn(lo, hi) over `threads` blocks of range(n), concurrently; returns when all are done.

        fn must release the GIL for its heavy work (BLAS, nogil Numba kernels).
        """
        parts = self.threads
        cuts = [n * i // parts for i in range(parts + 1)]
        self._run([(fn, (lo, hi)) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True) if hi > lo])

    def _run(self, calls) -> None:
        """Each (fn, args): the first on this thread, the others on the pool's workers at
        the same time (one after another where there are too few); returns when all are."""
        n = max(0, min(len(calls) - 1, len(self._pool)))
        for worker, (fn, args) in zip(self._pool[:n], calls[1 : 1 + n], strict=True):
            worker.submit(fn, *args)
        try:
            for fn, args in [calls[0], *calls[1 + n :]] if calls else []:
                fn(*args)
        finally:
            errors = [worker.wait() for worker in self._pool[:n]]  # every worker, always
        for error in errors:
            if error is not None:
                raise error


def _whole(out, a, b, trans_a, trans_b, accumulate) -> None:
    _product(out, a.T if trans_a else a, b.T if trans_b else b, accumulate)


def _product(out, a, b, accumulate: bool) -> None:
    if accumulate:
        out += a @ b
    else:
        np.matmul(a, b, out=out)
