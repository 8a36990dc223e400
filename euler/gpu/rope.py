"""Rotary position embedding on the GPU, in place on the q and k parts of fused qkv."""

from __future__ import annotations

from numba import cuda

from euler.gpu.memory import THREADS, grid_for
from euler.layer_math import rope_rotate


@cuda.jit
def rope_kernel(qkv, cos, sin, n_qk_heads, pos0, sign):
    """Rotate pairs (i, i + E/2) of the first n_qk_heads heads of qkv (B, T, C) in place.

    cos, sin (context, E/2); sign is +1 (forward) or -1 (backward) in the working type.
    One thread per (b, t, head, pair), grid-stride.
    """
    B, Tn, _ = qkv.shape
    half = cos.shape[1]
    E = 2 * half
    total = B * Tn * n_qk_heads * half
    idx = cuda.grid(1)
    while idx < total:
        i = idx % half
        r = idx // half
        h = r % n_qk_heads
        bt = r // n_qk_heads
        b = bt // Tn
        t = bt - b * Tn
        c = h * E + i
        s = sign * sin[pos0 + t, i]
        x1, x2 = rope_rotate(qkv[b, t, c], qkv[b, t, c + half], cos[pos0 + t, i], s)
        qkv[b, t, c] = x1
        qkv[b, t, c + half] = x2
        idx += cuda.gridsize(1)


def _rope(qkv, cos, sin, H, G, E, pos0, sign, stream, threads):
    B, Tn, C = qkv.shape
    assert C == (H + 2 * G) * E and cos.shape[1] == E // 2 and sin.shape == cos.shape
    assert pos0 + Tn <= cos.shape[0]
    n = B * Tn * (H + G) * (E // 2)
    rope_kernel[grid_for(n, threads), threads, stream](qkv, cos, sin, H + G, pos0, sign)


def rope_forward(qkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate q and k heads of qkv (B, T, (H+2G) E) in place; cos, sin (context, E/2)."""
    _rope(qkv, cos, sin, H, G, E, pos0, qkv.dtype.type(1.0), stream, threads)


def rope_backward(dqkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate the q and k gradients of dqkv (B, T, (H+2G) E) back, in place."""
    _rope(dqkv, cos, sin, H, G, E, pos0, dqkv.dtype.type(-1.0), stream, threads)
