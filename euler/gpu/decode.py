"""KV-cache decoding on the GPU: the products and attention of a few rows over the cache.

The same contract as euler/cpu/decode.py: n rows, row r a token of slot slots[r] at
position positions[r]; keys and values are written into the (S, G, C, E) caches first,
then row r attends to its slot's positions 0..positions[r]. Each row is computed alone, in
an order fixed by its sizes, so a row's result does not depend on what shares its call: a
product's output element is reduced by one warp (each lane's strided partial sum, then the
butterfly, whose every lane ends with the same bits; a warp takes one feature of one row,
one of 4 rows, or 4 of 4 rows, by the row count, in that order for each), and attention's
(row, head) by a block of WARPS warps splitting the keys, merged in warp order. Every
thread of a block takes the same number of reductions (the simulator's shared-memory path
meets at block barriers); the softmax's rescale and exp are layer_math's.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu.memory import grid_for
from euler.gpu.reduce import WARP, warp_max_all, warp_sum_all
from euler.layer_math import exp_, online_softmax_rescale

MAX_E = 256  # head sizes up to this
PER_LANE = MAX_E // WARP  # a lane keeps this many of a row's E values (a literal for local.array)
WARPS = 4  # warps a block of attention_decode_kernel, each taking every WARPS-th run of keys
KEYS = WARPS * WARP  # keys a block scores at once


@cuda.jit
def linear_element_kernel(out, x, w):
    """out (n, M) = x (n, D) @ w (M, D)^T, assigned: a warp an element (grid-stride), one
    warp a block; linear_kernel(F, R, W)'s order for each element."""
    n, D = x.shape
    M = w.shape[0]
    buf = cuda.shared.array(WARP, float32)
    lane = cuda.threadIdx.x
    job = cuda.blockIdx.x
    while job < n * M:  # the same for the whole block: one warp
        i = job // M
        m = job - i * M
        s = float32(0.0)
        for d in range(lane, D, WARP):
            s += x[i, d] * w[m, d]
        s = warp_sum_all(s, buf, float32(0.0))
        if lane == 0:
            out[i, m] = s
        job += cuda.gridDim.x


@cache
def linear_kernel(F: int, R: int, W: int):
    """The kernel out (n, M) = x (n, D) @ w (M, D)^T, assigned (M % F == 0), with warps of
    F features by R rows and W warps a block: warp job j = block f * groups + group
    (groups = ceil(n / R)) computes features f F .. f F + F - 1 of rows group R .. group R +
    R - 1, each lane loading F weight and R row elements a step for F R products. Grid-stride
    over jobs, a block's warps taking theirs together (the same count each)."""
    threads, FR = W * WARP, F * R  # constants of the kernel, as shared and local arrays need

    @cuda.jit
    def linear_tile_kernel(out, x, w):
        n, D = x.shape
        M = w.shape[0]
        buf = cuda.shared.array(threads, float32)
        s = cuda.local.array(FR, float32)
        wv = cuda.local.array(F, float32)
        lane = cuda.threadIdx.x % WARP
        groups = (n + R - 1) // R
        jobs = groups * (M // F)
        base = cuda.blockIdx.x * W
        while base < jobs:  # the same for the whole block
            job = base + cuda.threadIdx.x // WARP
            f0 = job // groups * F
            i0 = (job - job // groups * groups) * R
            for k in range(FR):
                s[k] = float32(0.0)
            if job < jobs:
                for d in range(lane, D, WARP):
                    for a in range(F):
                        wv[a] = w[f0 + a, d]
                    for k in range(R):
                        if i0 + k < n:
                            xv = x[i0 + k, d]
                            for a in range(F):
                                s[a * R + k] += xv * wv[a]
            for a in range(F):
                for k in range(R):
                    t = warp_sum_all(s[a * R + k], buf, float32(0.0))
                    if lane == 0 and job < jobs and i0 + k < n:
                        out[i0 + k, f0 + a] = t
            base += cuda.gridDim.x * W

    return linear_tile_kernel


def linear_shape(n: int, M: int) -> tuple[int, int, int]:
    """(features, rows, warps a block) of linear_kernel for n >= 2 rows and M features: up
    to 8 rows, a feature a warp for 4 rows (more features a warp win on some products and
    lose on others); past 8 rows, 4 features for 4 rows, which reads each weight row once
    for 4 rows of x (bench/labs/decode_linear_gpu.py times the choices). At batch 1
    linear_element_kernel is the fastest. Every choice takes each row's sum in the same
    order, so the bits do not depend on it."""
    if n <= 8:
        return 1, 4, 4
    return (4, 4, 4) if M % 4 == 0 else (1, 8, 4)


@cuda.jit
def kv_store_kernel(k_cache, v_cache, qkv, slots, positions, H, G, E):
    """k_cache, v_cache (S, G, C, E)[slots[r], :, positions[r]] = row r's keys and values
    in qkv (n, (H + 2G) E); a thread an element (grid-stride)."""
    n = qkv.shape[0]
    i = cuda.grid(1)
    while i < n * G * E:
        r = i // (G * E)
        ge = i - r * G * E
        g = ge // E
        e = ge - g * E
        k_cache[slots[r], g, positions[r], e] = qkv[r, (H + g) * E + e]
        v_cache[slots[r], g, positions[r], e] = qkv[r, (H + G + g) * E + e]
        i += cuda.gridsize(1)


@cuda.jit
def attention_decode_kernel(out, qkv, k_cache, v_cache, slots, positions, H, G, E, scale):
    """out (n, H E), assigned: block (r, h) attends row r's query head h to its slot's
    cached keys 0..positions[r] (kv head h // (H / G)) in runs of 32 keys, the CPU's tiles:
    warp w takes runs w, w + WARPS, ..., lane l scoring the run's key l against the whole
    query, and keeps an online softmax over its runs, lane l holding the output's elements
    e = l, l + 32, ...; the warps' partial sums are merged in warp order at the end."""
    buf = cuda.shared.array(KEYS, float32)
    q = cuda.shared.array(MAX_E, float32)
    p_run = cuda.shared.array(KEYS, float32)
    acc_w = cuda.shared.array((WARPS, MAX_E), float32)
    m_w = cuda.shared.array(WARPS, float32)
    total_w = cuda.shared.array(WARPS, float32)
    acc = cuda.local.array(PER_LANE, float32)
    tid = cuda.threadIdx.x
    lane = tid % WARP
    w = tid // WARP
    r = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - r * H
    g = h // (H // G)
    s = slots[r]
    n_keys = positions[r] + 1
    per = (E + WARP - 1) // WARP
    for e in range(tid, E, KEYS):
        q[e] = qkv[r, h * E + e] * scale
    for k in range(per):
        acc[k] = float32(0.0)
    cuda.syncthreads()
    m = float32(-math.inf)
    total = float32(0.0)
    for run in range((n_keys + KEYS - 1) // KEYS):  # the same count for every warp
        j0 = run * KEYS + w * WARP
        j = j0 + lane
        d = float32(-math.inf)
        if j < n_keys:
            d = float32(0.0)
            for e in range(E):
                d += q[e] * k_cache[s, g, j, e]
        m_new = max(m, warp_max_all(d, buf, float32(-math.inf)))
        alpha = online_softmax_rescale(m, m_new, float32)
        p = exp_(d - m_new) if j < n_keys else float32(0.0)
        total = total * alpha + warp_sum_all(p, buf, float32(0.0))
        p_run[tid] = p
        cuda.syncthreads()
        for k in range(per):
            e = lane + k * WARP
            if e < E:
                a = acc[k] * alpha
                for i in range(min(WARP, n_keys - j0)):
                    a += p_run[w * WARP + i] * v_cache[s, g, j0 + i, e]
                acc[k] = a
        m = m_new
        cuda.syncthreads()
    if lane == 0:
        m_w[w] = m
        total_w[w] = total
    for k in range(per):
        e = lane + k * WARP
        if e < E:
            acc_w[w, e] = acc[k]
    cuda.syncthreads()
    top = m_w[0]  # finite: warp 0 holds key 0
    for i in range(1, WARPS):
        top = max(top, m_w[i])
    for e in range(tid, E, KEYS):
        num = float32(0.0)
        den = float32(0.0)
        for i in range(WARPS):
            f = online_softmax_rescale(m_w[i], top, float32)
            num += acc_w[i, e] * f
            den += total_w[i] * f
        out[r, h * E + e] = num / den


def linear_rows(out, x, w, stream=0) -> None:
    """out (n, M) = x (n, D) @ w (M, D)^T, float32, each element alone (see the module)."""
    n, M = out.shape
    check_shapes("decode_linear", x=(x, (n, w.shape[1])), out=(out, (n, w.shape[0])))
    if n == 1 and M:
        linear_element_kernel[grid_for(M, 1), WARP, stream](out, x, w)
    elif n * M:
        F, R, W = linear_shape(n, M)
        grid = grid_for((n + R - 1) // R * (M // F), W)
        linear_kernel(F, R, W)[grid, W * WARP, stream](out, x, w)


def attention_decode(out, qkv, k_cache, v_cache, slots, positions, H, G, E, stream=0) -> None:
    """Write qkv (n, (H + 2G) E)'s keys and values into k_cache, v_cache (S, G, C, E) at
    (slots[r], positions[r]), then out (n, H E): row r attends to its slot's positions
    0..positions[r]. slots and positions (n,) int32 on the device, checked by the caller
    (their values are on the device: the backend checks the host copies it made them from)."""
    n = qkv.shape[0]
    S, C = (k_cache.shape[0], k_cache.shape[2]) if len(k_cache.shape) == 4 else (-1, -1)
    check_shapes("decode_attention", qkv=(qkv, (n, (H + 2 * G) * E)), out=(out, (n, H * E)),
                 k_cache=(k_cache, (S, G, C, E)), v_cache=(v_cache, (S, G, C, E)),
                 slots=(slots, (n,)), positions=(positions, (n,)))  # fmt: skip
    if G < 1 or H % G:
        raise ValueError(f"decode_attention: G={G} key/value heads do not divide H={H}")
    if E > MAX_E:
        raise ValueError(f"decode_attention: head size {E} above the kernel's {MAX_E}")
    if not n:
        return
    kv_store_kernel[grid_for(n * G * E), 256, stream](k_cache, v_cache, qkv, slots, positions,
                                                      H, G, E)  # fmt: skip
    scale = np.float32(1.0 / math.sqrt(E))
    attention_decode_kernel[n * H, KEYS, stream](out, qkv, k_cache, v_cache, slots, positions,
                                                 H, G, E, scale)  # fmt: skip
