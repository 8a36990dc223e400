"""RMSNorm on the GPU: one block per row with block reductions; dw from per-block partials.

The backward kernel gives each block a fixed slice of rows and has it sum its own dw
partial (one slot per column, owned by one thread), and a second kernel adds the partials
in a fixed order: no atomics, so dw is the same on every run.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from euler.gpu.reduce import MAX_THREADS, block_sum
from euler.layer_math import rms_rstd

ROWS_PER_CHUNK_BLOCKS = 264  # dw partials: 2 blocks per H200 multiprocessor


def row_threads(D: int, cap: int = 256) -> int:
    """A block size for one row of D: enough warps to cover it, at most cap."""
    return max(32, min(cap, (D + 31) // 32 * 32))


@cuda.jit
def rmsnorm_forward_kernel(y, rstd, x, w, eps):
    """y (N, D) = x / rms(x) * w (D,), rstd (N,); one block per row, grid-stride over rows."""
    N, D = x.shape
    T = x.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    n = cuda.blockIdx.x
    while n < N:
        s = T(0.0)
        for d in range(tid, D, cuda.blockDim.x):
            s += x[n, d] * x[n, d]
        s = block_sum(s, buf, T(0.0))
        r = rms_rstd(s, D, eps, T)
        for d in range(tid, D, cuda.blockDim.x):
            y[n, d] = x[n, d] * r * w[d]
        if tid == 0:
            rstd[n] = r
        n += cuda.gridDim.x


def rmsnorm_forward(y, rstd, x, w, eps, stream=0, threads: int = 0) -> None:
    """y (N, D) = x (N, D) / rms(x) * w (D,), assigned; rstd (N,) saved for the backward."""
    N, D = x.shape
    assert y.shape == (N, D) and rstd.shape == (N,) and w.shape == (D,)
    threads = threads or row_threads(D)
    grid = max(1, min(N, 65535))
    rmsnorm_forward_kernel[grid, threads, stream](y, rstd, x, w, x.dtype.type(eps))


@cuda.jit
def rmsnorm_backward_kernel(dx, partial, dy, dres, x, w, rstd):
    """dx (N, D) = dres + J^T dy; partial (C, D) = sum over block c's rows of dy x rstd.

    Block c owns rows [c N / C, (c + 1) N / C). dx may alias dres.
    """
    N, D = x.shape
    C = partial.shape[0]
    T = x.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    c = cuda.blockIdx.x
    for d in range(tid, D, cuda.blockDim.x):
        partial[c, d] = T(0.0)
    for n in range(c * N // C, (c + 1) * N // C):
        r = rstd[n]
        dot = T(0.0)
        for d in range(tid, D, cuda.blockDim.x):
            dot += dy[n, d] * w[d] * x[n, d]
        dot = block_sum(dot, buf, T(0.0))
        k = dot * r * r / T(D)
        for d in range(tid, D, cuda.blockDim.x):
            partial[c, d] += dy[n, d] * x[n, d] * r
            dx[n, d] = dres[n, d] + r * (dy[n, d] * w[d] - x[n, d] * k)


@cuda.jit
def sum_partials_kernel(dw, partial, accumulate):
    """dw (D,) (+)= sum over c of partial (C, D), in order c = 0..C-1; one thread per column."""
    C, D = partial.shape
    T = dw.dtype.type
    d = cuda.grid(1)
    if d < D:
        s = T(0.0)
        for c in range(C):
            s += partial[c, d]
        if accumulate:
            dw[d] += s
        else:
            dw[d] = s


def partial_rows(N: int) -> int:
    """Row chunks (C) of the backward: one block each."""
    return max(1, min(N, ROWS_PER_CHUNK_BLOCKS))


def rmsnorm_backward(
    dx, dw, dy, dres, x, w, rstd, accumulate, partial, stream=0, threads: int = 0
) -> None:
    """dx (N, D) = dres + J^T dy, assigned; dw (D,) (+)= sum_n dy x rstd (+= if accumulate).

    dx may alias dres. partial is (C, D) scratch with C = partial_rows(N) (or fewer rows).
    """
    N, D = x.shape
    assert dx.shape == dy.shape == dres.shape == (N, D) and rstd.shape == (N,)
    assert w.shape == (D,) and dw.shape == (D,) and partial.shape[1] == D
    threads = threads or row_threads(D)
    C = partial.shape[0]
    rmsnorm_backward_kernel[C, threads, stream](dx, partial, dy, dres, x, w, rstd)
    sum_partials_kernel[(D + 127) // 128, 128, stream](dw, partial, np.bool_(accumulate))
