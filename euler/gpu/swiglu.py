"""SwiGLU activation on the GPU over the fused gate|up projection output.

A block walks whole rows (columns by thread), so no thread divides its flat index by F:
a 64-bit integer division per element cost more than the element's memory traffic. Where
F % 4 == 0 and the buffers are 16-byte aligned (always, at the presets), each thread moves
4 columns per access (vector.py).
"""

from __future__ import annotations

from numba import cuda

from euler.backend import check_shapes
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.vector import aligned4, load4, store4
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


@cuda.jit
def swiglu_forward_vec_kernel(h, gu, F):
    """swiglu_forward_kernel on flat views h (N F,), gu (N 2F,), 4 columns per thread and
    step (16-byte loads; F % 4 == 0)."""
    N = h.shape[0] // F
    T = h.dtype.type
    n = cuda.blockIdx.x
    while n < N:
        for f in range(4 * cuda.threadIdx.x, F, 4 * cuda.blockDim.x):
            g0, g1, g2, g3 = load4(gu, 2 * n * F + f)
            u0, u1, u2, u3 = load4(gu, 2 * n * F + F + f)
            store4(
                h, n * F + f,
                swiglu_forward_scalar(g0, u0, T), swiglu_forward_scalar(g1, u1, T),
                swiglu_forward_scalar(g2, u2, T), swiglu_forward_scalar(g3, u3, T),
            )  # fmt: skip
        n += cuda.gridDim.x


def swiglu_forward(h, gu, stream=0, threads: int = THREADS) -> None:
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:], assigned; gu (N, 2F)."""
    N, F = h.shape
    check_shapes("swiglu_forward", gu=(gu, (N, 2 * F)))
    if F % 4 == 0 and aligned4(h, gu):
        flat = h.reshape(h.size), gu.reshape(gu.size)
        swiglu_forward_vec_kernel[grid_for(N, 1), threads, stream](*flat, F)
        return
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


@cuda.jit
def swiglu_backward_vec_kernel(dgu, dh, gu, F):
    """swiglu_backward_kernel on flat views dgu, gu (N 2F,), dh (N F,), 4 columns per thread
    and step (16-byte loads; F % 4 == 0)."""
    N = dh.shape[0] // F
    T = dh.dtype.type
    n = cuda.blockIdx.x
    while n < N:
        for f in range(4 * cuda.threadIdx.x, F, 4 * cuda.blockDim.x):
            g0, g1, g2, g3 = load4(gu, 2 * n * F + f)
            u0, u1, u2, u3 = load4(gu, 2 * n * F + F + f)
            d0, d1, d2, d3 = load4(dh, n * F + f)
            dg0, du0 = swiglu_backward_scalar(g0, u0, d0, T)
            dg1, du1 = swiglu_backward_scalar(g1, u1, d1, T)
            dg2, du2 = swiglu_backward_scalar(g2, u2, d2, T)
            dg3, du3 = swiglu_backward_scalar(g3, u3, d3, T)
            store4(dgu, 2 * n * F + f, dg0, dg1, dg2, dg3)
            store4(dgu, 2 * n * F + F + f, du0, du1, du2, du3)
        n += cuda.gridDim.x


def swiglu_backward(dgu, dh, gu, stream=0, threads: int = THREADS) -> None:
    """dgu (N, 2F) from dh (N, F) and the saved gu (N, 2F), assigned."""
    N, F = dh.shape
    check_shapes("swiglu_backward", gu=(gu, (N, 2 * F)), dgu=(dgu, (N, 2 * F)))
    if F % 4 == 0 and aligned4(dgu, dh, gu):
        flat = dgu.reshape(dgu.size), dh.reshape(dh.size), gu.reshape(gu.size)
        swiglu_backward_vec_kernel[grid_for(N, 1), threads, stream](*flat, F)
        return
    swiglu_backward_kernel[grid_for(N, 1), threads, stream](dgu, dh, gu)
