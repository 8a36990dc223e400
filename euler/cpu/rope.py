"""Rotary position embedding on the CPU, applied in place to the q and k parts of fused qkv."""

from __future__ import annotations

from numba import njit, prange

from euler.layer_math import rope_row


@njit(parallel=True, cache=True, error_model="numpy")
def _rope(qkv, cos, sin, n_qk_heads, E, pos0, sign):
    B, Tn, _ = qkv.shape
    for bt in prange(B * Tn):
        b = bt // Tn
        t = bt % Tn
        for h in range(n_qk_heads):
            rope_row(qkv[b, t, h * E : (h + 1) * E], cos[pos0 + t], sin[pos0 + t], sign)


def rope_forward(qkv, cos, sin, H, G, E, pos0=0):
    """Rotate q and k heads of qkv (B, T, (H+2G) E) in place; cos, sin (context, E/2)."""
    _rope(qkv, cos, sin, H + G, E, pos0, qkv.dtype.type(1.0))


def rope_backward(dqkv, cos, sin, H, G, E, pos0=0):
    """Rotate the q and k gradients of dqkv (B, T, (H+2G) E) back, in place."""
    _rope(dqkv, cos, sin, H + G, E, pos0, dqkv.dtype.type(-1.0))
