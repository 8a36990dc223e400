"""RMSNorm on the CPU: one row per prange iteration; the weight gradient via per-chunk partials."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from euler.cpu.chunks import CHUNKS
from euler.layer_math import rmsnorm_backward_row, rmsnorm_forward_row


@njit(parallel=True, cache=True, error_model="numpy")
def rmsnorm_forward(y, rstd, x, w, eps):
    """y (N, D) = x (N, D) / rms(x) * w (D,), assigned; rstd (N,) saved for the backward."""
    N = x.shape[0]
    T = x.dtype.type
    e = T(eps)
    for n in prange(N):
        rstd[n] = rmsnorm_forward_row(y[n], x[n], w, e, T)


@njit(parallel=True, cache=True, error_model="numpy")
def rmsnorm_backward(dx, dw, dy, dres, x, w, rstd, accumulate, inplace):
    """dx (N, D) = dres + J^T dy, assigned; dw (D,) (+)= sum_n dy x rstd (+= if accumulate).

    inplace says that dx and dres share memory (the residual gradient passes through in
    place): each dres row is then copied aside first, since LLVM vectorises the row loop
    only behind a run-time check that its output and inputs do not overlap (measured: 0.35
    against 0.14 ms at 2048 x 128). Each chunk of rows sums its own dw partial, so no two
    threads add into the same slot.
    """
    N, D = x.shape
    T = x.dtype.type
    nchunk = min(CHUNKS, N)
    partial = np.zeros((nchunk, D), dtype=x.dtype)
    for c in prange(nchunk):
        n0 = c * N // nchunk
        n1 = (c + 1) * N // nchunk
        res = np.empty(D, dtype=x.dtype)
        for n in range(n0, n1):
            if inplace:
                res[:] = dres[n]
            else:
                res = dres[n]
            rmsnorm_backward_row(dx[n], partial[c], dy[n], res, x[n], w, rstd[n], T)
    for d in range(D):
        s = T(0.0)
        for c in range(nchunk):
            s += partial[c, d]
        if accumulate:
            dw[d] += s
        else:
            dw[d] = s
