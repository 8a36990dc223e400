"""AdamW and the global gradient norm on the CPU, over the flat buffers."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.cpu.chunks import CHUNKS
from euler.layer_math import adamw_scalar


@njit(parallel=True, cache=True)
def grad_sumsq(grads):
    """Sum of squares of the flat gradient (P,), accumulated in float64 per chunk."""
    P = grads.shape[0]
    nchunk = CHUNKS
    partial = np.zeros(nchunk, dtype=np.float64)
    for c in prange(nchunk):
        s = 0.0
        for i in range(c * P // nchunk, (c + 1) * P // nchunk):
            g = np.float64(grads[i])
            s += g * g
        partial[c] = s
    return partial.sum()


@njit(parallel=True, cache=True)
def adamw_update(params, grads, m, v, lr, beta1, beta2, eps, wd, step, grad_scale, n_decay):
    """In-place AdamW on flat (P,) buffers; weight decay only on the prefix [0, n_decay).

    grad_scale multiplies every gradient first (global-norm clipping); step counts from 1.
    """
    P = params.shape[0]
    T = params.dtype.type
    b1, b2 = T(beta1), T(beta2)
    bc1 = T(1.0 - beta1**step)
    bc2 = T(1.0 - beta2**step)
    lr_, eps_, gs = T(lr), T(eps), T(grad_scale)
    nchunk = CHUNKS
    for c in prange(nchunk):
        for i in range(c * P // nchunk, (c + 1) * P // nchunk):
            wd_ = T(wd) if i < n_decay else T(0.0)
            p, mi, vi = adamw_scalar(
                params[i], grads[i] * gs, m[i], v[i], lr_, b1, b2, eps_, wd_, bc1, bc2, T
            )
            params[i] = p
            m[i] = mi
            v[i] = vi


def clip_scale(norm: float, max_norm: float) -> float:
    """Factor that brings a gradient of `norm` down to `max_norm` (1 if already within)."""
    if max_norm <= 0.0 or norm <= max_norm or not math.isfinite(norm):
        return 1.0
    return max_norm / (norm + 1e-6)
