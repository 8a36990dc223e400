"""SwiGLU activation on the GPU over the fused gate|up projection output."""

from __future__ import annotations

from numba import cuda

from euler.gpu.memory import THREADS, grid_for
from euler.layer_math import swiglu_backward_scalar, swiglu_forward_scalar


@cuda.jit
def swiglu_forward_kernel(h, gu):
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:]; one thread per element of h, grid-stride."""
    N, F = h.shape
    T = h.dtype.type
    i = cuda.grid(1)
    while i < N * F:
        n = i // F
        f = i - n * F
        h[n, f] = swiglu_forward_scalar(gu[n, f], gu[n, F + f], T)
        i += cuda.gridsize(1)


def swiglu_forward(h, gu, stream=0, threads: int = THREADS) -> None:
    """h (N, F) = silu(gu[:, :F]) * gu[:, F:], assigned; gu (N, 2F)."""
    N, F = h.shape
    assert gu.shape == (N, 2 * F)
    swiglu_forward_kernel[grid_for(N * F, threads), threads, stream](h, gu)


@cuda.jit
def swiglu_backward_kernel(dgu, dh, gu):
    """dgu (N, 2F) from dh (N, F) and gu (N, 2F); one thread per element of dh."""
    N, F = dh.shape
    T = dh.dtype.type
    i = cuda.grid(1)
    while i < N * F:
        n = i // F
        f = i - n * F
        dg, du = swiglu_backward_scalar(gu[n, f], gu[n, F + f], dh[n, f], T)
        dgu[n, f] = dg
        dgu[n, F + f] = du
        i += cuda.gridsize(1)


def swiglu_backward(dgu, dh, gu, stream=0, threads: int = THREADS) -> None:
    """dgu (N, 2F) from dh (N, F) and the saved gu (N, 2F), assigned."""
    N, F = dh.shape
    assert gu.shape == (N, 2 * F) and dgu.shape == (N, 2 * F)
    swiglu_backward_kernel[grid_for(N * F, threads), threads, stream](dgu, dh, gu)
