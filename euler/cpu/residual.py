"""Residual add on the CPU (its backward is the identity, folded into RMSNorm's backward)."""

from __future__ import annotations

from numba import njit, prange

from euler.layer_math import residual_add


@njit(parallel=True, cache=True, error_model="numpy")
def residual_forward(out, a, b):
    """out (N, D) = a + b, assigned; out may alias a."""
    N, D = out.shape
    for n in prange(N):
        for d in range(D):
            out[n, d] = residual_add(a[n, d], b[n, d])
