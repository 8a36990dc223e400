"""Residual add on the GPU (its backward is the identity, folded into RMSNorm's backward).

Both kernels take flat views; the 16-byte one moves 4 floats a thread and access (vector.py).

    kernel                       runs where
    residual_forward_vec_kernel  float32, 16-byte aligned, size % 4 == 0 (every preset)
    residual_forward_kernel      anywhere else: the generic fallback
"""

from __future__ import annotations

from numba import cuda

from euler.backend import check_shapes
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.vector import aligned4, load4, store4
from euler.layer_math import residual_add


@cuda.jit
def residual_forward_kernel(out, a, b):
    """out (N,) = a + b on flattened (N D,) views, grid-stride."""
    i = cuda.grid(1)
    while i < out.shape[0]:
        out[i] = residual_add(a[i], b[i])
        i += cuda.gridsize(1)


@cuda.jit
def residual_forward_vec_kernel(out, a, b):
    """out (N,) = a + b, 4 elements per thread and step (16-byte loads; N % 4 == 0)."""
    i = 4 * cuda.grid(1)
    while i < out.shape[0]:
        a0, a1, a2, a3 = load4(a, i)
        b0, b1, b2, b3 = load4(b, i)
        store4(out, i, residual_add(a0, b0), residual_add(a1, b1), residual_add(a2, b2),
               residual_add(a3, b3))  # fmt: skip
        i += 4 * cuda.gridsize(1)


def residual_forward(out, a, b, stream=0, threads: int = THREADS) -> None:
    """out (N, D) = a + b, assigned; out may alias a."""
    check_shapes("residual_forward", a=(a, out.shape), b=(b, out.shape))
    n = out.size
    flat = out.reshape(n), a.reshape(n), b.reshape(n)
    if aligned4(*flat):
        residual_forward_vec_kernel[grid_for(n // 4, threads), threads, stream](*flat)
        return
    residual_forward_kernel[grid_for(n, threads), threads, stream](*flat)
