"""Causal grouped-query FlashAttention on the CPU.

Forward: for each query row, keys are visited in tiles of `tile`; an online softmax keeps a
running max m, sum l and output accumulator, rescaled once per tile, and the row's
logsumexp m + log(l) is saved. Backward: probabilities are recomputed from that logsumexp
tile by tile, so no T x T matrix is ever stored.

qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query head h reads kv head
h // (H / G). Threads split (batch, head) in the forward and (batch, kv head) in the
backward, so each thread owns every gradient slot it writes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.layer_math import online_softmax_rescale

TILE = 32


@njit(parallel=True, cache=True)
def attention_forward(out, lse, qkv, H, G, E, tile):
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E)."""
    B, Tn, _ = qkv.shape
    T = qkv.dtype.type
    scale = T(1.0 / math.sqrt(E))
    rep = H // G
    for bh in prange(B * H):
        b = bh // H
        h = bh % H
        qo = h * E
        ko = H * E + (h // rep) * E
        vo = H * E + G * E + (h // rep) * E
        s = np.empty(tile, dtype=qkv.dtype)
        acc = np.empty(E, dtype=qkv.dtype)
        q = np.empty(E, dtype=qkv.dtype)
        for i in range(Tn):
            for e in range(E):
                q[e] = qkv[b, i, qo + e] * scale
                acc[e] = T(0.0)
            m = T(-np.inf)
            l = T(0.0)
            for j0 in range(0, i + 1, tile):
                j1 = min(j0 + tile, i + 1)
                mt = T(-np.inf)
                for j in range(j0, j1):
                    dot = T(0.0)
                    for e in range(E):
                        dot += q[e] * qkv[b, j, ko + e]
                    s[j - j0] = dot
                    mt = max(mt, dot)
                m_new = max(m, mt)
                alpha = online_softmax_rescale(m, m_new, T)
                l *= alpha
                for e in range(E):
                    acc[e] *= alpha
                for j in range(j0, j1):
                    p = math.exp(s[j - j0] - m_new)
                    l += p
                    for e in range(E):
                        acc[e] += p * qkv[b, j, vo + e]
                m = m_new
            inv = T(1.0) / l
            for e in range(E):
                out[b, i, qo + e] = acc[e] * inv
            lse[b, h, i] = m + math.log(l)


@njit(parallel=True, cache=True)
def attention_backward(dqkv, dout, qkv, out, lse, H, G, E, tile):
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    With P = exp(S - lse) recomputed: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)),
    dQ = dS K / sqrt(E), dK = dS^T Q / sqrt(E).
    """
    B, Tn, _ = qkv.shape
    T = qkv.dtype.type
    scale = T(1.0 / math.sqrt(E))
    rep = H // G
    for bg in prange(B * G):
        b = bg // G
        g = bg % G
        ko = H * E + g * E
        vo = H * E + G * E + g * E
        for t in range(Tn):
            for e in range(E):
                dqkv[b, t, ko + e] = T(0.0)
                dqkv[b, t, vo + e] = T(0.0)
        q = np.empty(E, dtype=qkv.dtype)
        do = np.empty(E, dtype=qkv.dtype)
        dq = np.empty(E, dtype=qkv.dtype)
        for hh in range(rep):
            h = g * rep + hh
            qo = h * E
            for i in range(Tn):
                di = T(0.0)
                for e in range(E):
                    q[e] = qkv[b, i, qo + e]
                    do[e] = dout[b, i, qo + e]
                    di += do[e] * out[b, i, qo + e]
                    dq[e] = T(0.0)
                li = lse[b, h, i]
                for j0 in range(0, i + 1, tile):
                    for j in range(j0, min(j0 + tile, i + 1)):
                        sdot = T(0.0)
                        dp = T(0.0)
                        for e in range(E):
                            sdot += q[e] * qkv[b, j, ko + e]
                            dp += do[e] * qkv[b, j, vo + e]
                        p = math.exp(sdot * scale - li)
                        ds = p * (dp - di) * scale
                        for e in range(E):
                            dq[e] += ds * qkv[b, j, ko + e]
                            dqkv[b, j, ko + e] += ds * q[e]
                            dqkv[b, j, vo + e] += p * do[e]
                for e in range(E):
                    dqkv[b, i, qo + e] = dq[e]
