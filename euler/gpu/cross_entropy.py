"""Fused softmax cross-entropy on the GPU: one block per row, block max and sum reductions.

The row's logits are read three times (max, sum of exponentials, gradient); a row of
V = 4096 floats is 16 KB and stays in L1/L2 between the passes. The loss sum over the K
heads is reduced on the device into a 1-element buffer, so reading it is the only wait.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from euler.backend import check_shapes
from euler.gpu.reduce import MAX_THREADS, block_max, block_sum
from euler.layer_math import cross_entropy_grad, cross_entropy_loss_from_stats, exp_

THREADS = 256


@cuda.jit(device=True)
def _row_stats(logits, n, buf, T):
    """(max, sum of exp(logit - max)) of row n, returned to every thread of the block."""
    V = logits.shape[1]
    tid = cuda.threadIdx.x
    m = T(-math.inf)
    for i in range(tid, V, cuda.blockDim.x):
        m = max(m, logits[n, i])
    m = block_max(m, buf, T(-math.inf))
    s = T(0.0)
    for i in range(tid, V, cuda.blockDim.x):
        s += exp_(logits[n, i] - m)
    s = block_sum(s, buf, T(0.0))
    return m, s


@cuda.jit
def cross_entropy_forward_backward_kernel(losses, logits, targets, scales, k):
    """losses (N,); logits (N, V) becomes scales[k] * (softmax - onehot(target)); -1 = none."""
    N, V = logits.shape
    T = logits.dtype.type
    scale = T(scales[k])
    buf = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    n = cuda.blockIdx.x
    while n < N:
        t = targets[n]
        if t < 0:
            for i in range(tid, V, cuda.blockDim.x):
                logits[n, i] = T(0.0)
            if tid == 0:
                losses[n] = T(0.0)
        else:
            m, s = _row_stats(logits, n, buf, T)
            if tid == 0:
                losses[n] = cross_entropy_loss_from_stats(m, s, logits[n, t])
            cuda.syncthreads()  # the target's logit is read above before it is overwritten
            inv = T(1.0) / s
            for i in range(tid, V, cuda.blockDim.x):
                g = cross_entropy_grad(exp_(logits[n, i] - m), inv, scale)
                if i == t:
                    g -= scale
                logits[n, i] = g
        n += cuda.gridDim.x


def cross_entropy_forward_backward(
    losses, logits, targets, scales, k, stream=0, threads: int = THREADS
) -> None:
    """losses (N,) = -log softmax(logits)[target]; logits (N, V) becomes scale * dloss/dlogits.

    targets (N,) int, -1 = no target (loss 0, gradient 0); scale = scales[k], read from the
    (K,) float64 device array on the device (a captured step's heads follow the batch).
    """
    N = logits.shape[0]
    check_shapes("cross_entropy_forward_backward", losses=(losses, (N,)), targets=(targets, (N,)))
    grid = max(1, min(N, 65535))
    cross_entropy_forward_backward_kernel[grid, threads, stream](
        losses, logits, targets, scales, np.int64(k)
    )


@cuda.jit
def cross_entropy_forward_kernel(losses, logits, targets):
    """losses (N,) = logsumexp(logits (N, V)) - logits[target], 0 where target < 0."""
    N, V = logits.shape
    T = logits.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    n = cuda.blockIdx.x
    while n < N:
        t = targets[n]
        if t < 0:
            if cuda.threadIdx.x == 0:
                losses[n] = T(0.0)
        else:
            m, s = _row_stats(logits, n, buf, T)
            if cuda.threadIdx.x == 0:
                losses[n] = cross_entropy_loss_from_stats(m, s, logits[n, t])
        n += cuda.gridDim.x


def cross_entropy_forward(losses, logits, targets, stream=0, threads: int = THREADS) -> None:
    """losses (N,) = -log softmax(logits (N, V))[target], 0 where target < 0; logits unchanged."""
    N = logits.shape[0]
    check_shapes("cross_entropy_forward", losses=(losses, (N,)), targets=(targets, (N,)))
    grid = max(1, min(N, 65535))
    cross_entropy_forward_kernel[grid, threads, stream](losses, logits, targets)


@cuda.jit
def loss_sum_kernel(out, losses, head_scale):
    """out (1,) float64 = sum_k head_scale[k] * sum_n losses (K, N); a single block."""
    K, N = losses.shape
    buf = cuda.shared.array(MAX_THREADS, float64)
    acc = float64(0.0)
    for k in range(K):
        s = float64(0.0)
        for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
            s += float64(losses[k, n])
        acc += s * head_scale[k]
    acc = block_sum(acc, buf, float64(0.0))
    if cuda.threadIdx.x == 0:
        out[0] = acc


def loss_sum(out, losses, head_scale, stream=0, threads: int = 1024) -> None:
    """out (1,) float64 = sum_k head_scale[k] * sum(losses[k]); head_scale (K,) float64 on
    the device."""
    check_shapes("loss_sum", out=(out, (1,)), head_scale=(head_scale, losses.shape[:1]))
    loss_sum_kernel[1, threads, stream](out, losses, head_scale)
