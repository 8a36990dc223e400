"""Rotary position embedding on the GPU, in place on the q and k parts of fused qkv."""

from __future__ import annotations

from numba import cuda

from euler.gpu.memory import THREADS, grid_for
from euler.layer_math import rope_rotate


@cuda.jit
def rope_kernel(qkv, cos, sin, n_qk_heads, pos0, sign):
    """Rotate pairs (i, i + E/2) of the first n_qk_heads heads of qkv (B, T, C) in place.

    cos, sin (context, E/2); sign is +1 (forward) or -1 (backward) in the working type.
    A block per (b, t) row, rows strided over the grid; thread (x, y) takes pairs x, x + X,
    ... of heads y, y + Y, ...: no thread divides a flat index (a 64-bit integer division
    per element cost more than the element's memory traffic).
    """
    B, Tn, _ = qkv.shape
    half = cos.shape[1]
    E = 2 * half
    row = cuda.blockIdx.x
    while row < B * Tn:
        b = row // Tn
        t = row - b * Tn
        for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
            c, s = cos[pos0 + t, i], sign * sin[pos0 + t, i]
            for h in range(cuda.threadIdx.y, n_qk_heads, cuda.blockDim.y):
                k = h * E + i
                x1, x2 = rope_rotate(qkv[b, t, k], qkv[b, t, k + half], c, s)
                qkv[b, t, k] = x1
                qkv[b, t, k + half] = x2
        row += cuda.gridDim.x


def _rope(qkv, cos, sin, H, G, E, pos0, sign, stream, threads):
    B, Tn, C = qkv.shape
    assert C == (H + 2 * G) * E and cos.shape[1] == E // 2 and sin.shape == cos.shape
    assert pos0 + Tn <= cos.shape[0]
    x = min(32, E // 2)
    block = (x, max(1, threads // x))
    rope_kernel[grid_for(B * Tn, 1), block, stream](qkv, cos, sin, H + G, pos0, sign)


def rope_forward(qkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate q and k heads of qkv (B, T, (H+2G) E) in place; cos, sin (context, E/2)."""
    _rope(qkv, cos, sin, H, G, E, pos0, qkv.dtype.type(1.0), stream, threads)


def rope_backward(dqkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate the q and k gradients of dqkv (B, T, (H+2G) E) back, in place."""
    _rope(dqkv, cos, sin, H, G, E, pos0, dqkv.dtype.type(-1.0), stream, threads)
