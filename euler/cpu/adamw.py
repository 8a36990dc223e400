"""AdamW and the global gradient norm on the CPU, over the flat buffers.

Each chunk works on slices of the buffers: an index that starts at a chunk's (unknown sign)
offset makes Numba wrap negative indices at every access, which stops LLVM vectorising the
loop (measured: AdamW over 1.05 M parameters 4.4 ms, sliced 0.5 ms on one core).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from euler.cpu.chunks import CHUNKS
from euler.layer_math import adamw_scalar

LANES = 8  # partial sums per chunk in grad_sumsq: a fixed count, so the same order anywhere


@njit(parallel=True, cache=True, error_model="numpy")
def grad_sumsq(grads):
    """Sum of squares of the flat gradient (P,), accumulated in float64 per chunk.

    Each chunk keeps LANES interleaved partial sums (element i into lane i % LANES), which
    LLVM can hold in one vector register; the order is fixed by the code, not the machine.
    """
    P = grads.shape[0]
    nchunk = CHUNKS
    partial = np.zeros(nchunk, dtype=np.float64)
    for c in prange(nchunk):
        g = grads[c * P // nchunk : (c + 1) * P // nchunk]
        lanes = np.zeros(LANES, dtype=np.float64)
        full = g.shape[0] - g.shape[0] % LANES
        for i0 in range(0, full, LANES):
            for k in range(LANES):
                x = np.float64(g[i0 + k])
                lanes[k] += x * x
        for i in range(full, g.shape[0]):
            x = np.float64(g[i])
            lanes[i - full] += x * x
        s = 0.0
        for k in range(LANES):
            s += lanes[k]
        partial[c] = s
    return partial.sum()


@njit(cache=True, error_model="numpy")
def _adamw_slice(params, grads, m, v, lr, b1, b2, eps, wd, bc1, bc2, gs):
    """AdamW on equal-length slices, one weight decay for all of them."""
    T = params.dtype.type
    for i in range(params.shape[0]):
        p, mi, vi = adamw_scalar(
            params[i], grads[i] * gs, m[i], v[i], lr, b1, b2, eps, wd, bc1, bc2, T
        )
        params[i] = p
        m[i] = mi
        v[i] = vi


@njit(parallel=True, cache=True, error_model="numpy")
def adamw_update(params, grads, m, v, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale, n_decay):
    """In-place AdamW on flat (P,) buffers; weight decay only on the prefix [0, n_decay).

    grad_scale multiplies every gradient first (global-norm clipping); bc1, bc2 are the
    bias corrections 1 - beta1^step, 1 - beta2^step (step counting from 1).
    """
    P = params.shape[0]
    T = params.dtype.type
    b1, b2 = T(beta1), T(beta2)
    bc1_, bc2_ = T(bc1), T(bc2)
    lr_, eps_, gs = T(lr), T(eps), T(grad_scale)
    nchunk = CHUNKS
    for c in prange(nchunk):
        i0 = c * P // nchunk
        i1 = (c + 1) * P // nchunk
        d = min(max(n_decay, i0), i1)  # [i0, d) decays, [d, i1) does not
        for lo, hi, wd_ in ((i0, d, T(wd)), (d, i1, T(0.0))):
            _adamw_slice(
                params[lo:hi], grads[lo:hi], m[lo:hi], v[lo:hi],
                lr_, b1, b2, eps_, wd_, bc1_, bc2_, gs,
            )  # fmt: skip
