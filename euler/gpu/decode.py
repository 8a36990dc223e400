"""KV-cache decoding on the GPU: the products and attention of a few rows over the cache.

The same contract as euler/cpu/decode.py: n rows, row r a token of slot slots[r] at
position positions[r]; keys and values are written into the (S, G, C, E) caches first,
then row r attends to its slot's positions 0..positions[r]. Each row is computed alone:
every output element is reduced by one warp in an order fixed by its sizes (each lane's
strided partial sum, then the butterfly, whose every lane ends with the same bits), so a
row's result does not depend on what shares its call. One warp a block, so that a block's
threads always take the same number of reductions (the simulator's shared-memory path
meets at block barriers); the softmax's rescale and exp are layer_math's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu.memory import grid_for
from euler.gpu.reduce import MAX_THREADS, WARP, warp_sum_all
from euler.layer_math import exp_, online_softmax_rescale

MAX_E = 256  # head sizes up to this
PER_LANE = MAX_E // WARP  # a lane keeps this many of a row's E values (a literal for local.array)


@cuda.jit
def linear_kernel(out, x, w):
    """out (n, M) = x (n, D) @ w (M, D)^T, assigned: a warp an element (grid-stride)."""
    n, D = x.shape
    M = w.shape[0]
    buf = cuda.shared.array(MAX_THREADS, float32)
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
    cached keys 0..positions[r] (kv head h // (H / G)), one key at a time (online softmax);
    lane l holds the elements e = l, l + 32, ... of the query and the running output."""
    buf = cuda.shared.array(MAX_THREADS, float32)
    qv = cuda.local.array(PER_LANE, float32)
    acc = cuda.local.array(PER_LANE, float32)
    lane = cuda.threadIdx.x
    r = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - r * H
    g = h // (H // G)
    s = slots[r]
    per = (E + WARP - 1) // WARP
    for k in range(per):
        e = lane + k * WARP
        qv[k] = qkv[r, h * E + e] * scale if e < E else float32(0.0)
        acc[k] = float32(0.0)
    m = float32(-math.inf)
    total = float32(0.0)
    for j in range(positions[r] + 1):
        d = float32(0.0)
        for k in range(per):
            e = lane + k * WARP
            if e < E:
                d += qv[k] * k_cache[s, g, j, e]
        d = warp_sum_all(d, buf, float32(0.0))
        m_new = max(m, d)
        alpha = online_softmax_rescale(m, m_new, float32)
        p = exp_(d - m_new)
        total = total * alpha + p
        for k in range(per):
            e = lane + k * WARP
            if e < E:
                acc[k] = acc[k] * alpha + p * v_cache[s, g, j, e]
        m = m_new
    inv = float32(1.0) / total
    for k in range(per):
        e = lane + k * WARP
        if e < E:
            out[r, h * E + e] = acc[k] * inv


def linear_rows(out, x, w, stream=0) -> None:
    """out (n, M) = x (n, D) @ w (M, D)^T, float32, each element alone (see the module)."""
    n, M = out.shape
    check_shapes("decode_linear", x=(x, (n, w.shape[1])), out=(out, (n, w.shape[0])))
    if n * M:
        linear_kernel[grid_for(n * M, 1), WARP, stream](out, x, w)


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
    attention_decode_kernel[n * H, WARP, stream](out, qkv, k_cache, v_cache, slots, positions,
                                                 H, G, E, scale)  # fmt: skip
