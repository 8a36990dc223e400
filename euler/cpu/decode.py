"""Inference kernels on the CPU: attention of a few new query rows over a KV cache.

Generation feeds n new tokens at positions pos0 .. pos0+n-1 (n = the prompt at prefill,
1 per plain decoding step, K when speculative decoding verifies a draft). Their keys and
values are appended to the cache first, so row i attends to cached positions 0 .. pos0+i.

Each query row is computed alone, in the same order of operations whatever n is: a row's
output must not depend on how many rows share the call, or speculative decoding (n = K)
could disagree with plain greedy decoding (n = 1) in the last bit and flip an argmax.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.layer_math import exp_, online_softmax_rescale

TILE = 32  # keys per online-softmax rescale


@njit(parallel=True, cache=True, error_model="numpy")
def attention_decode(out, q, k_cache, v_cache, pos0, H, G, E):
    """out (n, H E), assigned, from q (n, H E) and k_cache, v_cache (G, C, E).

    Row i is the query at position pos0 + i (RoPE applied); it attends causally to the
    cache's positions 0 .. pos0 + i, which must already hold this call's keys and values.
    Query head h reads kv head h // (H / G).
    """
    n = q.shape[0]
    T = q.dtype.type
    scale = T(1.0 / math.sqrt(E))
    rep = H // G
    for job in prange(n * H):
        i = job // H
        h = job % H
        g = h // rep
        keys = pos0 + i + 1
        qv = np.empty(E, dtype=q.dtype)
        for e in range(E):
            qv[e] = q[i, h * E + e] * scale
        acc = np.zeros(E, dtype=q.dtype)
        s = np.empty(TILE, dtype=q.dtype)
        m = T(-np.inf)
        total = T(0.0)
        for j0 in range(0, keys, TILE):
            nt = min(TILE, keys - j0)
            mt = T(-np.inf)
            for j in range(nt):
                d = T(0.0)
                for e in range(E):
                    d += qv[e] * k_cache[g, j0 + j, e]
                s[j] = d
                mt = max(mt, d)
            m_new = max(m, mt)
            alpha = online_softmax_rescale(m, m_new, T)
            total *= alpha
            for e in range(E):
                acc[e] *= alpha
            for j in range(nt):
                p = exp_(s[j] - m_new)
                total += p
                for e in range(E):
                    acc[e] += p * v_cache[g, j0 + j, e]
            m = m_new
        inv = T(1.0) / total
        for e in range(E):
            out[i, h * E + e] = acc[e] * inv
