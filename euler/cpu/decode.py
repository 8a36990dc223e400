"""Inference kernels on the CPU: KV-cache attention and matrix products for decoding rows.

A decoding forward feeds n rows, each a token of some sequence: row r belongs to cache slot
slots[r] and sits at position positions[r] (a prompt's rows at prefill, 1 row per active
sequence at each batched step, K rows when speculative decoding verifies a draft). The
keys and values of every row are written to the cache first, so row r attends to its
slot's positions 0 .. positions[r], this call's earlier rows of that slot included.

Each row is computed alone, in the same order of operations whatever n is and whichever
rows share the call: a row's output must not depend on them, or batched decoding could
disagree with decoding a sequence alone (and speculative decoding, n = K, with plain
greedy decoding, n = 1) in the last bit and flip an argmax. nogil: the server's scheduler
thread runs these beside the event loop that streams their tokens.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.layer_math import ROW_FAST, dot_row, exp_, online_softmax_rescale

TILE = 32  # keys per online-softmax rescale
OUT_BLOCK = 16  # output features per prange job of linear_rows: a weight block kept in L1


@njit(parallel=True, cache=True, error_model="numpy", nogil=True, fastmath=ROW_FAST)
def attention_decode(out, qkv, k_cache, v_cache, slots, positions, H, G, E):
    """out (n, H E), assigned, from qkv (n, (H + 2G) E) (RoPE applied) and the caches
    k_cache, v_cache (S, G, C, E), into which this call's keys and values are written.

    Row r is the query at position positions[r] of slot slots[r]; it attends causally to
    that slot's positions 0 .. positions[r]. Query head h reads kv head h // (H / G).
    """
    n = qkv.shape[0]
    T = qkv.dtype.type
    scale = T(1.0 / math.sqrt(E))
    rep = H // G
    # every key and value first, since a row may attend to an earlier row: a serial loop of
    # copies, as a second prange in this kernel took 1.2 of its 5 s of compiling
    for r in range(n):
        s, p = slots[r], positions[r]
        for g in range(G):
            for e in range(E):
                k_cache[s, g, p, e] = qkv[r, (H + g) * E + e]
                v_cache[s, g, p, e] = qkv[r, (H + G + g) * E + e]
    for job in prange(n * H):
        i = job // H
        h = job % H
        g = h // rep
        s = slots[i]
        keys = positions[i] + 1
        qv = np.empty(E, dtype=qkv.dtype)
        for e in range(E):
            qv[e] = qkv[i, h * E + e] * scale
        acc = np.zeros(E, dtype=qkv.dtype)
        sc = np.empty(TILE, dtype=qkv.dtype)
        m = T(-np.inf)
        total = T(0.0)
        for j0 in range(0, keys, TILE):
            nt = min(TILE, keys - j0)
            mt = T(-np.inf)
            for j in range(nt):
                d = T(0.0)
                for e in range(E):
                    d += qv[e] * k_cache[s, g, j0 + j, e]
                sc[j] = d
                mt = max(mt, d)
            m_new = max(m, mt)
            alpha = online_softmax_rescale(m, m_new, T)
            total *= alpha
            for e in range(E):
                acc[e] *= alpha
            for j in range(nt):
                pj = exp_(sc[j] - m_new)
                total += pj
                for e in range(E):
                    acc[e] += pj * v_cache[s, g, j0 + j, e]
            m = m_new
        inv = T(1.0) / total
        for e in range(E):
            out[i, h * E + e] = acc[e] * inv


@njit(parallel=True, cache=True, error_model="numpy", nogil=True)
def linear_rows(out, x, w):
    """out (n, M), assigned, = x (n, D) @ w (M, D)^T, every element one dot_row.

    The jobs are blocks of OUT_BLOCK output features; each reads its block of w once for
    all n rows (what batching buys), and each element is the same dot product of two rows
    whatever n is, so a row's result does not depend on the rows beside it.
    """
    n = x.shape[0]
    M = w.shape[0]
    T = x.dtype.type
    for b in prange((M + OUT_BLOCK - 1) // OUT_BLOCK):
        for i in range(n):
            for m in range(b * OUT_BLOCK, min(M, (b + 1) * OUT_BLOCK)):
                out[i, m] = dot_row(x[i], w[m], T)
