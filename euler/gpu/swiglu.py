"""SwiGLU activation on the GPU over the fused gate|up projection output.

A block walks whole rows (columns by thread), so no thread divides its flat index by F:
a 64-bit integer division per element cost more than the element's memory traffic.
"""

from __future__ import annotations

from numba import cuda

from euler.gpu.memory import THREADS, grid_for
from euler.layer_math import swiglu_backward_scalar, swiglu_forward_scalar


@cuda.jit
def swiglu_forward_kernel(h, gu):
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:]; a block per row, rows strided over the grid."""
    N, F = h.shape
    T = h.dtype.type
    n = cuda.blockIdx.x
    while n < N:
        for f in range(cuda.threadIdx.x, F, cuda.blockDim.x):
            h[n, f] = swiglu_forward_scalar(gu[n, f], gu[n, F + f], T)
        n += cuda.gridDim.x


def swiglu_forward(h, gu, stream=0, threads: int = THREADS) -> None:
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:], assigned; gu (N, 2F)."""
    N, F = h.shape
    assert gu.shape == (N, 2 * F)
    swiglu_forward_kernel[grid_for(N, 1), threads, stream](h, gu)


@cuda.jit
def swiglu_backward_kernel(dgu, dh, gu):
    """dgu (N, 2F) from dh (N, F) and gu (N, 2F); a block per row, rows strided over the grid."""
    N, F = dh.shape
    T = dh.dtype.type
    n = cuda.blockIdx.x
    while n < N:
        for f in range(cuda.threadIdx.x, F, cuda.blockDim.x):
            dg, du = swiglu_backward_scalar(gu[n, f], gu[n, F + f], dh[n, f], T)
            dgu[n, f] = dg
            dgu[n, F + f] = du
        n += cuda.gridDim.x


def swiglu_backward(dgu, dh, gu, stream=0, threads: int = THREADS) -> None:
    """dgu (N, 2F) from dh (N, F) and the saved gu (N, 2F), assigned."""
    N, F = dh.shape
    assert gu.shape == (N, 2 * F) and dgu.shape == (N, 2 * F)
    swiglu_backward_kernel[grid_for(N, 1), threads, stream](dgu, dh, gu)
