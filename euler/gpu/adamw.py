"""AdamW, the global gradient norm and clipping on the GPU, with no host synchronisation.

    kernel                      runs where
    grad_sumsq_kernel, then     the norm: per-block float64 sums of squares (NORM_BLOCKS_PER_SM
    norm_and_scale_kernel       blocks a multiprocessor), then the norm and clip factor
    adamw_vec_kernel            float32 run, P % 4 == 0, 16-byte aligned (every preset)
    adamw_lowp_vec_kernel       bf16 run (bf16 weight copies written too), the same condition
    adamw_kernel                float32 anywhere else: the generic fallback
    adamw_lowp_kernel           bf16 anywhere else: the generic fallback of the bf16 run

The norm is reduced on the device into a float64 scalar, the clip factor is computed from
it on the device (with layer_math's `clip_scale`, which the CPU engine uses too), and the
update kernel reads that factor from device memory: the host never waits for the norm.

Under --precision bf16 the update also refreshes the products' bf16 weight copies (lowp):
the same pass rounds each new float32 parameter to bf16 once and stores it, 4 an 8-byte
store beside the float32 buffers' 16-byte accesses (adamw_lowp_vec_kernel says why not 8 a
16-byte store), so the copies cost 2 bytes a parameter and no pass of their own.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

from euler.backend import check_shapes
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.reduce import MAX_THREADS, block_sum
from euler.gpu.vector import aligned4, aligned8_bf16, load4, store4, store4_bf16
from euler.layer_math import adamw_scalar, bf16_round, clip_scale
from euler.precision import is_bf16

NORM_BLOCKS_PER_SM = 4  # sum-of-squares blocks a multiprocessor: enough to fill it


@cuda.jit
def grad_sumsq_kernel(partial, grads):
    """partial (C,) float64 = sum of squares of block c's grid-stride share of grads (P,)."""
    buf = cuda.shared.array(MAX_THREADS, float64)
    s = float64(0.0)
    i = cuda.grid(1)
    while i < grads.shape[0]:
        g = float64(grads[i])
        s += g * g
        i += cuda.gridsize(1)
    s = block_sum(s, buf, float64(0.0))
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = s


@cuda.jit
def norm_and_scale_kernel(stats, partial, max_norm):
    """stats (2,) float64 = (norm, clip factor) from partial (C,); a single block."""
    buf = cuda.shared.array(MAX_THREADS, float64)
    s = float64(0.0)
    for c in range(cuda.threadIdx.x, partial.shape[0], cuda.blockDim.x):
        s += partial[c]
    s = block_sum(s, buf, float64(0.0))
    if cuda.threadIdx.x == 0:
        norm = math.sqrt(s)
        stats[0] = norm
        stats[1] = clip_scale(norm, max_norm)


def norm_blocks(P: int, threads: int, blocks: int) -> int:
    """Blocks (C) of the sum-of-squares pass over P gradients: at most `blocks` (the
    backend's NORM_BLOCKS_PER_SM times its multiprocessors), at most one a block of P."""
    return max(1, min(blocks, (P + threads - 1) // threads))


def grad_norm(stats, partial, grads, max_norm, stream=0, threads: int = THREADS) -> None:
    """stats (2,) float64 = (L2 norm of grads (P,), its clip factor); partial (C,) scratch."""
    check_shapes("grad_norm", stats=(stats, (2,)), partial=(partial, partial.shape[:1]))
    grad_sumsq_kernel[partial.shape[0], threads, stream](partial, grads)
    norm_and_scale_kernel[1, threads, stream](stats, partial, float(max_norm))


@cuda.jit(device=True)
def _adamw_at(i, p, g, m, v, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T):
    """adamw_scalar of parameter i: its gradient scaled by the clip factor gs, weight decay
    only on the prefix [0, n_decay). Returns (p, m, v)."""
    wd_ = wd if i < n_decay else T(0.0)
    return adamw_scalar(p, g * gs, m, v, lr, beta1, beta2, eps, wd_, bc1, bc2, T)


@cuda.jit
def adamw_kernel(params, grads, m, v, stats, hyper, beta1, beta2, eps, wd, n_decay):
    """In-place AdamW on flat (P,) buffers, gradients scaled by stats[1]; decay on [0, n_decay).

    hyper (3,) float64 = (learning rate, 1 - beta1^step, 1 - beta2^step), read on the device
    so that a captured step (CUDA graph) follows the schedule.
    """
    T = params.dtype.type
    gs = T(stats[1])
    lr, bc1, bc2 = T(hyper[0]), T(hyper[1]), T(hyper[2])
    i = cuda.grid(1)
    while i < params.shape[0]:
        _adamw1(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T)
        i += cuda.gridsize(1)


@cuda.jit(device=True)
def _adamw1(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T):
    """The step on parameter i; returns the new parameter."""
    p, mi, vi = _adamw_at(i, params[i], grads[i], m[i], v[i], gs, lr, beta1, beta2, eps,
                          wd, n_decay, bc1, bc2, T)  # fmt: skip
    params[i] = p
    m[i] = mi
    v[i] = vi
    return p


@cuda.jit(device=True)
def _adamw4(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T):
    """The step on parameters i .. i + 3 (16-byte accesses); returns the 4 new parameters."""
    p0, p1, p2, p3 = load4(params, i)
    g0, g1, g2, g3 = load4(grads, i)
    m0, m1, m2, m3 = load4(m, i)
    v0, v1, v2, v3 = load4(v, i)
    p0, m0, v0 = _adamw_at(i, p0, g0, m0, v0, gs, lr, beta1, beta2, eps,
                           wd, n_decay, bc1, bc2, T)  # fmt: skip
    p1, m1, v1 = _adamw_at(i + 1, p1, g1, m1, v1, gs, lr, beta1, beta2, eps,
                           wd, n_decay, bc1, bc2, T)  # fmt: skip
    p2, m2, v2 = _adamw_at(i + 2, p2, g2, m2, v2, gs, lr, beta1, beta2, eps,
                           wd, n_decay, bc1, bc2, T)  # fmt: skip
    p3, m3, v3 = _adamw_at(i + 3, p3, g3, m3, v3, gs, lr, beta1, beta2, eps,
                           wd, n_decay, bc1, bc2, T)  # fmt: skip
    store4(params, i, p0, p1, p2, p3)
    store4(m, i, m0, m1, m2, m3)
    store4(v, i, v0, v1, v2, v3)
    return p0, p1, p2, p3


@cuda.jit
def adamw_vec_kernel(params, grads, m, v, stats, hyper, beta1, beta2, eps, wd, n_decay):
    """adamw_kernel with 4 parameters per thread and step (16-byte accesses; P % 4 == 0)."""
    T = params.dtype.type
    gs = T(stats[1])
    lr, bc1, bc2 = T(hyper[0]), T(hyper[1]), T(hyper[2])
    i = 4 * cuda.grid(1)
    while i < params.shape[0]:
        _adamw4(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T)
        i += 4 * cuda.gridsize(1)


@cuda.jit
def adamw_lowp_kernel(lowp, params, grads, m, v, stats, hyper, beta1, beta2, eps, wd, n_decay):
    """adamw_kernel that also stores each new parameter rounded to bf16 into lowp (P,)."""
    T = params.dtype.type
    gs = T(stats[1])
    lr, bc1, bc2 = T(hyper[0]), T(hyper[1]), T(hyper[2])
    i = cuda.grid(1)
    while i < params.shape[0]:
        p = _adamw1(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd, n_decay, bc1, bc2, T)
        lowp[i] = bf16_round(p)
        i += cuda.gridsize(1)


@cuda.jit
def adamw_lowp_vec_kernel(lowp, params, grads, m, v, stats, hyper, beta1, beta2, eps, wd,
                          n_decay):  # fmt: skip
    """adamw_lowp_kernel with 4 parameters per thread and step (P % 4 == 0): 16-byte
    accesses of the float32 buffers, one 8-byte store of the 4 bf16 copies: the copies then
    cost what their 2 bytes a parameter cost, where 8 parameters a thread with one 16-byte
    bf16 store ran slower (twice the registers, fewer threads in flight)."""
    T = params.dtype.type
    gs = T(stats[1])
    lr, bc1, bc2 = T(hyper[0]), T(hyper[1]), T(hyper[2])
    i = 4 * cuda.grid(1)
    while i < params.shape[0]:
        a0, a1, a2, a3 = _adamw4(params, grads, m, v, i, gs, lr, beta1, beta2, eps, wd,
                                 n_decay, bc1, bc2, T)  # fmt: skip
        store4_bf16(lowp, i, a0, a1, a2, a3)
        i += 4 * cuda.gridsize(1)


def adamw_update(
    params, grads, m, v, stats, hyper, beta1, beta2, eps, wd, n_decay,
    stream=0, threads: int = THREADS, lowp=None,
) -> None:  # fmt: skip
    """In-place AdamW on flat (P,) float32 buffers; the clip factor is read from stats[1] on
    the device.

    hyper (3,) float64 device array: (lr, 1 - beta1^step, 1 - beta2^step), step counting
    from 1; weight decay only on the prefix [0, n_decay). lowp (P,) bf16, if given, receives
    the new params rounded to bf16 by the same kernel.
    """
    P = params.shape[0]
    check_shapes("adamw_update", grads=(grads, (P,)), m=(m, (P,)), v=(v, (P,)), hyper=(hyper, (3,)))
    for name, a in (("params", params), ("grads", grads), ("m", m), ("v", v)):
        if a.dtype != np.float32:
            raise ValueError(f"adamw_update: {name} is {a.dtype}; float32 expected")
    T = params.dtype.type
    args = (params, grads, m, v, stats, hyper, T(beta1), T(beta2), T(eps), T(wd), np.int64(n_decay))
    if lowp is not None:
        check_shapes("adamw_update", lowp=(lowp, (P,)))
        if not is_bf16(lowp):
            raise ValueError(f"adamw_update: lowp is {lowp.dtype}; bf16 (uint16 bits) expected")
        # 8-byte stores of lowp from its start on 16 bytes (its 8-element groups' check)
        if aligned4(params, grads, m, v) and aligned8_bf16(lowp[: P - P % 8]):
            grid = grid_for(P // 4, threads, cap=4096)
            adamw_lowp_vec_kernel[grid, threads, stream](lowp, *args)
            return
        adamw_lowp_kernel[grid_for(P, threads, cap=4096), threads, stream](lowp, *args)
        return
    if aligned4(params, grads, m, v):
        adamw_vec_kernel[grid_for(P // 4, threads, cap=4096), threads, stream](*args)
        return
    adamw_kernel[grid_for(P, threads, cap=4096), threads, stream](*args)
