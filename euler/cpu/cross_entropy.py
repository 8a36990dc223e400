"""Fused softmax cross-entropy on the CPU, one row per prange iteration."""

from __future__ import annotations

from numba import njit, prange

from euler.layer_math import cross_entropy_row, logsumexp_row


@njit(parallel=True, cache=True, error_model="numpy")
def cross_entropy_forward_backward(losses, logits, targets, scale):
    """losses (N,) = -log softmax(logits)[target]; logits (N, V) becomes scale * dloss/dlogits.

    targets (N,) int, -1 = no target (loss 0, gradient 0).
    """
    N = logits.shape[0]
    T = logits.dtype.type
    s = T(scale)
    for n in prange(N):
        losses[n] = cross_entropy_row(logits[n], targets[n], s, T)


@njit(parallel=True, cache=True, error_model="numpy")
def cross_entropy_forward(losses, logits, targets):
    """losses (N,) = -log softmax(logits (N, V))[target], 0 where target < 0; logits unchanged."""
    N = logits.shape[0]
    T = logits.dtype.type
    for n in prange(N):
        t = targets[n]
        if t < 0:
            losses[n] = T(0.0)
        else:
            losses[n] = logsumexp_row(logits[n], T) - logits[n, t]
