"""Fused softmax cross-entropy on the GPU: one block per row, block max and sum reductions.

    kernel                                        runs where
    cross_entropy_forward[_backward]_kernel       float32 logits, any V
    cross_entropy_forward[_backward]_bf16_kernel  bf16 logits, 16-byte pieces where V % 8 == 0
                                                  and aligned (a flag), else one at a time
    loss_sum_kernel                               the heads' loss sum into one float64

The row's logits are read three times (max, sum of exponentials, gradient); a row of
V = 4096 floats is 16 KB and stays in L1/L2 between the passes. The loss sum over the K
heads is reduced on the device into a 1-element buffer, so reading it is the only wait.

bf16 logits (--precision bf16: a product's output, turned into dlogits in place that feed
two products) are widened to float32: the row's max, sum and logsumexp and the loss are
float32, the gradient is rounded to bf16 once where stored. Rows of V % 8 == 0 in a 16-byte
aligned buffer (every preset) move 8 logits per 16-byte access (vector.py); others one.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from euler.backend import check_shapes
from euler.gpu.reduce import MAX_THREADS, block_max, block_sum
from euler.gpu.vector import aligned8_bf16, load8_bf16, store8_bf16
from euler.layer_math import (
    bf16_round,
    bf16_widen,
    cross_entropy_grad,
    cross_entropy_loss_from_stats,
    exp_,
)
from euler.precision import is_bf16

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

    losses float32; logits float32 or bf16 (uint16 bits, the gradient rounded to bf16).
    targets (N,) int, -1 = no target (loss 0, gradient 0); scale = scales[k], read from the
    (K,) float64 device array on the device (a captured step's heads follow the batch).
    """
    N = logits.shape[0]
    check_shapes("cross_entropy_forward_backward", losses=(losses, (N,)), targets=(targets, (N,)))
    grid = max(1, min(N, 65535))
    if _bf16_logits("cross_entropy_forward_backward", losses, logits):
        flat, V, vec = _flat_bf16(logits)
        cross_entropy_forward_backward_bf16_kernel[grid, threads, stream](
            losses, flat, V, vec, targets, scales, np.int64(k)
        )
        return
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
    """losses (N,) = -log softmax(logits (N, V))[target], 0 where target < 0; logits unchanged.

    losses float32; logits float32 or bf16 (uint16 bits)."""
    N = logits.shape[0]
    check_shapes("cross_entropy_forward", losses=(losses, (N,)), targets=(targets, (N,)))
    grid = max(1, min(N, 65535))
    if _bf16_logits("cross_entropy_forward", losses, logits):
        flat, V, vec = _flat_bf16(logits)
        cross_entropy_forward_bf16_kernel[grid, threads, stream](losses, flat, V, vec, targets)
        return
    cross_entropy_forward_kernel[grid, threads, stream](losses, logits, targets)


# ---------------------------------------------------------------- bf16 logits


def _bf16_logits(where: str, losses, logits) -> bool:
    """Whether logits are bf16; ValueError naming the argument for dtypes the model never
    passes (losses are float32 in every precision)."""
    if losses.dtype != np.float32:
        raise ValueError(f"{where}: losses is {losses.dtype}; float32 expected")
    if logits.dtype != np.float32 and not is_bf16(logits):
        raise ValueError(f"{where}: logits is {logits.dtype}; float32 or bf16 expected")
    return is_bf16(logits)


def _flat_bf16(logits):
    """(flat view (N V,), V, whether rows go 8 logits per 16-byte access) of bf16 logits."""
    V = logits.shape[1]
    return logits.reshape(logits.size), np.int64(V), V % 8 == 0 and aligned8_bf16(logits)


@cuda.jit(device=True)
def _row_stats_bf16(logits, base, V, vec, buf):
    """_row_stats of the bf16 row logits[base : base + V] (flat), in float32: 8 logits per
    16-byte load where vec, else one."""
    tid, step = cuda.threadIdx.x, cuda.blockDim.x
    m = float32(-math.inf)
    if vec:
        for i in range(8 * tid, V, 8 * step):
            x0, x1, x2, x3, x4, x5, x6, x7 = load8_bf16(logits, base + i)
            m = max(m, max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7))))
    else:
        for i in range(tid, V, step):
            m = max(m, bf16_widen(logits[base + i]))
    m = block_max(m, buf, float32(-math.inf))
    s = float32(0.0)
    if vec:
        for i in range(8 * tid, V, 8 * step):
            x0, x1, x2, x3, x4, x5, x6, x7 = load8_bf16(logits, base + i)
            s += (exp_(x0 - m) + exp_(x1 - m)) + (exp_(x2 - m) + exp_(x3 - m))
            s += (exp_(x4 - m) + exp_(x5 - m)) + (exp_(x6 - m) + exp_(x7 - m))
    else:
        for i in range(tid, V, step):
            s += exp_(bf16_widen(logits[base + i]) - m)
    s = block_sum(s, buf, float32(0.0))
    return m, s


@cuda.jit(device=True)
def _grad(x, i, t, m, inv, scale):
    """scale * (softmax - onehot(t)) of logit x at column i, in float32."""
    g = cross_entropy_grad(exp_(x - m), inv, scale)
    return g - scale if i == t else g


@cuda.jit
def cross_entropy_forward_backward_bf16_kernel(losses, logits, V, vec, targets, scales, k):
    """cross_entropy_forward_backward_kernel on flat bf16 logits (N V,), rows 8 logits per
    16-byte access where vec: float32 statistics and loss, the gradient rounded once."""
    N = losses.shape[0]
    scale = float32(scales[k])
    zero = float32(0.0)
    buf = cuda.shared.array(MAX_THREADS, float32)
    tid, step = cuda.threadIdx.x, cuda.blockDim.x
    n = cuda.blockIdx.x
    while n < N:
        t = targets[n]
        base = n * V
        if t < 0:
            if vec:
                for i in range(8 * tid, V, 8 * step):
                    store8_bf16(logits, base + i, zero, zero, zero, zero, zero, zero, zero, zero)
            else:
                for i in range(tid, V, step):
                    logits[base + i] = bf16_round(zero)
            if tid == 0:
                losses[n] = zero
        else:
            m, s = _row_stats_bf16(logits, base, V, vec, buf)
            if tid == 0:
                losses[n] = cross_entropy_loss_from_stats(m, s, bf16_widen(logits[base + t]))
            cuda.syncthreads()  # the target's logit is read above before it is overwritten
            inv = float32(1.0) / s
            if vec:
                for i in range(8 * tid, V, 8 * step):
                    x0, x1, x2, x3, x4, x5, x6, x7 = load8_bf16(logits, base + i)
                    g0, g1 = _grad(x0, i, t, m, inv, scale), _grad(x1, i + 1, t, m, inv, scale)
                    g2, g3 = _grad(x2, i + 2, t, m, inv, scale), _grad(x3, i + 3, t, m, inv, scale)
                    g4, g5 = _grad(x4, i + 4, t, m, inv, scale), _grad(x5, i + 5, t, m, inv, scale)
                    g6, g7 = _grad(x6, i + 6, t, m, inv, scale), _grad(x7, i + 7, t, m, inv, scale)
                    store8_bf16(logits, base + i, g0, g1, g2, g3, g4, g5, g6, g7)
            else:
                for i in range(tid, V, step):
                    g = _grad(bf16_widen(logits[base + i]), i, t, m, inv, scale)
                    logits[base + i] = bf16_round(g)
        n += cuda.gridDim.x


@cuda.jit
def cross_entropy_forward_bf16_kernel(losses, logits, V, vec, targets):
    """cross_entropy_forward_kernel on flat bf16 logits (N V,), float32 statistics and loss."""
    N = losses.shape[0]
    buf = cuda.shared.array(MAX_THREADS, float32)
    n = cuda.blockIdx.x
    while n < N:
        t = targets[n]
        if t < 0:
            if cuda.threadIdx.x == 0:
                losses[n] = float32(0.0)
        else:
            m, s = _row_stats_bf16(logits, n * V, V, vec, buf)
            if cuda.threadIdx.x == 0:
                losses[n] = cross_entropy_loss_from_stats(m, s, bf16_widen(logits[n * V + t]))
        n += cuda.gridDim.x


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
