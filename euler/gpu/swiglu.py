"""SwiGLU activation on the GPU over the fused gate|up projection output.

    kernel (forward / backward)        runs where
    swiglu_*_vec_kernel                float32, F % 4 == 0, 16-byte aligned (every preset)
    swiglu_*_vec_bf16_kernel           bf16, F % 8 == 0, 16-byte aligned (every preset)
    swiglu_*_kernel                    anything else, float32 or bf16: the generic fallback

A block walks whole rows (columns by thread), so no thread divides its flat index by F:
a 64-bit integer division per element cost more than the element's memory traffic. Where
F % 4 == 0 and the buffers are 16-byte aligned (always, at the presets), each thread moves
4 columns per access (vector.py).

Under bf16 (euler.precision) gu, h, dh and dgu are all bf16 (uint16 bits): the kernels
widen each value where read, compute in float32 through the same layer_math helpers and
round once where stored; the bf16 16-byte kernels move 8 columns a thread and access.
"""

from __future__ import annotations

from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu.bf16 import stored, widen
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.vector import (
    aligned4,
    aligned8_bf16,
    check_dtypes,
    load4,
    load8_bf16,
    store4,
    store8_bf16,
)
from euler.layer_math import swiglu_backward_scalar, swiglu_forward_scalar
from euler.precision import BF16, is_bf16

# threads a block of the 16-byte bf16 kernels, at most: a thread moves 8 columns, so a row
# of F = 2048 takes 4 steps of 64 threads; small blocks of several steps a row beat one
# step a row in 256 threads (bench/labs/bf16_memory_kernels_gpu.py)
BF16_THREADS = 64


@cuda.jit
def swiglu_forward_kernel(h, gu):
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:]; a block per row, rows strided over the grid.
    h, gu float32 or bf16 (bf16.widen, bf16.stored), the arithmetic float32."""
    N, F = h.shape
    n = cuda.blockIdx.x
    while n < N:
        for f in range(cuda.threadIdx.x, F, cuda.blockDim.x):
            g, u = widen(gu[n, f]), widen(gu[n, F + f])
            h[n, f] = stored(h, swiglu_forward_scalar(g, u, float32))
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


@cuda.jit
def swiglu_forward_vec_bf16_kernel(h, gu, F):
    """swiglu_forward_kernel in bf16 on flat views h (N F,), gu (N 2F,), 8 columns per thread
    and step (16-byte accesses; F % 8 == 0)."""
    N = h.shape[0] // F
    T = float32
    n = cuda.blockIdx.x
    while n < N:
        for f in range(8 * cuda.threadIdx.x, F, 8 * cuda.blockDim.x):
            g0, g1, g2, g3, g4, g5, g6, g7 = load8_bf16(gu, 2 * n * F + f)
            u0, u1, u2, u3, u4, u5, u6, u7 = load8_bf16(gu, 2 * n * F + F + f)
            store8_bf16(
                h, n * F + f,
                swiglu_forward_scalar(g0, u0, T), swiglu_forward_scalar(g1, u1, T),
                swiglu_forward_scalar(g2, u2, T), swiglu_forward_scalar(g3, u3, T),
                swiglu_forward_scalar(g4, u4, T), swiglu_forward_scalar(g5, u5, T),
                swiglu_forward_scalar(g6, u6, T), swiglu_forward_scalar(g7, u7, T),
            )  # fmt: skip
        n += cuda.gridDim.x


def swiglu_forward(h, gu, stream=0, threads: int = THREADS) -> None:
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:], assigned; gu (N, 2F); both float32 or both
    bf16."""
    N, F = h.shape
    check_shapes("swiglu_forward", gu=(gu, (N, 2 * F)))
    if is_bf16(h):
        check_dtypes("swiglu_forward", BF16, gu=gu)
        if F % 8 == 0 and aligned8_bf16(h, gu):
            flat = h.reshape(h.size), gu.reshape(gu.size)
            block = min(threads, BF16_THREADS)
            swiglu_forward_vec_bf16_kernel[grid_for(N, 1), block, stream](*flat, F)
            return
    elif F % 4 == 0 and aligned4(h, gu):
        flat = h.reshape(h.size), gu.reshape(gu.size)
        swiglu_forward_vec_kernel[grid_for(N, 1), threads, stream](*flat, F)
        return
    swiglu_forward_kernel[grid_for(N, 1), threads, stream](h, gu)


@cuda.jit
def swiglu_backward_kernel(dgu, dh, gu):
    """dgu (N, 2F) from dh (N, F) and gu (N, 2F); a block per row, rows strided over the grid.
    All float32 or all bf16 (bf16.widen, bf16.stored), the arithmetic float32."""
    N, F = dh.shape
    n = cuda.blockIdx.x
    while n < N:
        for f in range(cuda.threadIdx.x, F, cuda.blockDim.x):
            g, u, d = widen(gu[n, f]), widen(gu[n, F + f]), widen(dh[n, f])
            dg, du = swiglu_backward_scalar(g, u, d, float32)
            dgu[n, f] = stored(dgu, dg)
            dgu[n, F + f] = stored(dgu, du)
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


@cuda.jit
def swiglu_backward_vec_bf16_kernel(dgu, dh, gu, F):
    """swiglu_backward_kernel in bf16 on flat views dgu, gu (N 2F,), dh (N F,), 8 columns per
    thread and step (16-byte accesses; F % 8 == 0)."""
    N = dh.shape[0] // F
    T = float32
    n = cuda.blockIdx.x
    while n < N:
        for f in range(8 * cuda.threadIdx.x, F, 8 * cuda.blockDim.x):
            g0, g1, g2, g3, g4, g5, g6, g7 = load8_bf16(gu, 2 * n * F + f)
            u0, u1, u2, u3, u4, u5, u6, u7 = load8_bf16(gu, 2 * n * F + F + f)
            d0, d1, d2, d3, d4, d5, d6, d7 = load8_bf16(dh, n * F + f)
            dg0, du0 = swiglu_backward_scalar(g0, u0, d0, T)
            dg1, du1 = swiglu_backward_scalar(g1, u1, d1, T)
            dg2, du2 = swiglu_backward_scalar(g2, u2, d2, T)
            dg3, du3 = swiglu_backward_scalar(g3, u3, d3, T)
            dg4, du4 = swiglu_backward_scalar(g4, u4, d4, T)
            dg5, du5 = swiglu_backward_scalar(g5, u5, d5, T)
            dg6, du6 = swiglu_backward_scalar(g6, u6, d6, T)
            dg7, du7 = swiglu_backward_scalar(g7, u7, d7, T)
            store8_bf16(dgu, 2 * n * F + f, dg0, dg1, dg2, dg3, dg4, dg5, dg6, dg7)
            store8_bf16(dgu, 2 * n * F + F + f, du0, du1, du2, du3, du4, du5, du6, du7)
        n += cuda.gridDim.x


def swiglu_backward(dgu, dh, gu, stream=0, threads: int = THREADS) -> None:
    """dgu (N, 2F) from dh (N, F) and the saved gu (N, 2F), assigned; all float32 or all
    bf16."""
    N, F = dh.shape
    check_shapes("swiglu_backward", gu=(gu, (N, 2 * F)), dgu=(dgu, (N, 2 * F)))
    if is_bf16(dgu):
        check_dtypes("swiglu_backward", BF16, dh=dh, gu=gu)
        if F % 8 == 0 and aligned8_bf16(dgu, dh, gu):
            flat = dgu.reshape(dgu.size), dh.reshape(dh.size), gu.reshape(gu.size)
            block = min(threads, BF16_THREADS)
            swiglu_backward_vec_bf16_kernel[grid_for(N, 1), block, stream](*flat, F)
            return
    elif F % 4 == 0 and aligned4(dgu, dh, gu):
        flat = dgu.reshape(dgu.size), dh.reshape(dh.size), gu.reshape(gu.size)
        swiglu_backward_vec_kernel[grid_for(N, 1), threads, stream](*flat, F)
        return
    swiglu_backward_kernel[grid_for(N, 1), threads, stream](dgu, dh, gu)
