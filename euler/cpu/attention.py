"""Causal grouped-query FlashAttention on the CPU.

The backend runs it for sequences longer than attention_dense.DENSE_MAX_T, and at every
length when it was given a tile; shorter sequences go through attention_dense.py.

Forward: queries are taken eight rows at a time; keys are visited in tiles of `tile`; an
online softmax keeps each row's running max m, sum l and output accumulator, rescaled once
per tile, and saves the row's logsumexp m + log(l). Backward: probabilities are recomputed
from that logsumexp tile by tile, so no T x T matrix is ever stored.

qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query head h reads kv head
h // (H / G). Threads split (batch, head) in the forward and (batch, kv head) in the
backward, so each thread owns every gradient slot it writes.

Speed: each job copies its K and V head into contiguous scratch (also transposed where a
product runs along the other axis), and every product is written as eight dot products
that share each load of K or V: one query row at a time, a short loop's set-up cost more
than its arithmetic. Measured on this project's 2-core machine (AVX-512): four rows per
pass cut the score cost per (query, key) pair from about 30 ns to 1.4 ns against one row
at a time, the dot form beat a four-row axpy form 2.7x, and eight rows beat four by 9%
(forward) and 14% (backward) at the `small` shapes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.layer_math import exp_, online_softmax_rescale, softmax_grad

TILE = 64
ROWS = 8  # query rows per block; the kernels below are written out for exactly eight
FAST = {"reassoc", "contract", "nsz", "arcp"}  # lets sums vectorise; keeps inf/nan semantics
# The helpers below are functions of their own, called, not inlined: inlined into both
# kernels' prange bodies, which Numba's parallel lowering optimises twice, they made a dtype's
# two kernels take 18.7 s to compile; called, 12.8 s, with the same bits and speed (one
# process on the 2-core AVX2 EPYC, float32, B=4, T=1024, 2 threads: forward 32.1 against
# 31.0 ms, backward 74.1 against 71.0; 2026-12-07).
HELPER = dict(inline="never", fastmath=FAST, error_model="numpy")


@njit(**HELPER)
def _scores8(s, qb, k, j0, n):
    """s[r, j] = qb[r] . k[j0 + j] for the eight rows r and j < n; k (T, E) row-major."""
    E = qb.shape[1]
    T = s.dtype.type
    q0, q1, q2, q3, q4, q5, q6, q7 = qb[0], qb[1], qb[2], qb[3], qb[4], qb[5], qb[6], qb[7]
    for j in range(n):
        kr = k[j0 + j]
        d0 = d1 = d2 = d3 = d4 = d5 = d6 = d7 = T(0.0)
        for e in range(E):
            kk = kr[e]
            d0 += q0[e] * kk
            d1 += q1[e] * kk
            d2 += q2[e] * kk
            d3 += q3[e] * kk
            d4 += q4[e] * kk
            d5 += q5[e] * kk
            d6 += q6[e] * kk
            d7 += q7[e] * kk
        s[0, j] = d0
        s[1, j] = d1
        s[2, j] = d2
        s[3, j] = d3
        s[4, j] = d4
        s[5, j] = d5
        s[6, j] = d6
        s[7, j] = d7


@njit(**HELPER)
def _accumulate8(acc, p, vt, j0, n):
    """acc[r, e] += sum_{j < n} p[r, j] V[j0 + j, e] for the eight rows r; vt is V^T (E, T)."""
    E = acc.shape[1]
    T = acc.dtype.type
    p0, p1, p2, p3, p4, p5, p6, p7 = p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
    for e in range(E):
        # a slice, so that the loop below indexes from 0: an index j0 + j would be guarded
        # against negative values at each access, which stops it vectorising
        vr = vt[e, j0 : j0 + n]
        d0 = d1 = d2 = d3 = d4 = d5 = d6 = d7 = T(0.0)
        for j in range(n):
            vv = vr[j]
            d0 += p0[j] * vv
            d1 += p1[j] * vv
            d2 += p2[j] * vv
            d3 += p3[j] * vv
            d4 += p4[j] * vv
            d5 += p5[j] * vv
            d6 += p6[j] * vv
            d7 += p7[j] * vv
        acc[0, e] += d0
        acc[1, e] += d1
        acc[2, e] += d2
        acc[3, e] += d3
        acc[4, e] += d4
        acc[5, e] += d5
        acc[6, e] += d6
        acc[7, e] += d7


@njit(**HELPER)
def _rank8_update(acc, a, x, j0, n):
    """acc[j0 + j] += sum_r a[r, j] x[r] for j < n: a rank-8 update of rows of acc (T, E)."""
    E = x.shape[1]
    x0, x1, x2, x3, x4, x5, x6, x7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    for j in range(n):
        a0, a1, a2, a3 = a[0, j], a[1, j], a[2, j], a[3, j]
        a4, a5, a6, a7 = a[4, j], a[5, j], a[6, j], a[7, j]
        row = acc[j0 + j]
        for e in range(E):
            row[e] += (
                a0 * x0[e] + a1 * x1[e] + a2 * x2[e] + a3 * x3[e]
                + a4 * x4[e] + a5 * x5[e] + a6 * x6[e] + a7 * x7[e]
            )  # fmt: skip


@njit(**HELPER)
def _online_softmax8(s, acc, m, l, i0, last, j0, n):
    """The online softmax of the eight rows' scores s[:, :n] (keys j0 .. j0 + n - 1, causal
    for rows i0 ..): s becomes exp(s - new max), acc, m, l rescaled and updated."""
    E = acc.shape[1]
    T = s.dtype.type
    for r in range(ROWS):
        valid = min(n, min(i0 + r, last) - j0 + 1)  # causal: keys <= row
        mt = T(-np.inf)
        for j in range(valid):
            mt = max(mt, s[r, j])
        m_new = max(m[r], mt)
        alpha = online_softmax_rescale(m[r], m_new, T)
        for e in range(E):
            acc[r, e] *= alpha
        total = T(0.0)
        for j in range(valid):
            p = exp_(s[r, j] - m_new)
            s[r, j] = p
            total += p
        for j in range(valid, n):
            s[r, j] = T(0.0)
        l[r] = l[r] * alpha + total
        m[r] = m_new


@njit(**HELPER)
def _softmax_grad8(s, dp, li, di, scale, i0, last, j0, n):
    """s: the eight rows' scores -> P = exp(s scale - lse); dp: dO V^T -> dS, both zero past
    the causal edge and in rows past the end (repeats, which must add nothing)."""
    T = s.dtype.type
    for r in range(ROWS):
        valid = min(n, i0 + r - j0 + 1) if i0 + r <= last else 0
        for j in range(valid):
            p = exp_(s[r, j] * scale - li[r])
            dp[r, j] = softmax_grad(p, dp[r, j], di[r]) * scale  # dS
            s[r, j] = p
        for j in range(max(valid, 0), n):
            dp[r, j] = T(0.0)
            s[r, j] = T(0.0)


@njit(parallel=True, cache=True, fastmath=FAST, error_model="numpy")
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
        k = np.empty((Tn, E), dtype=qkv.dtype)
        vt = np.empty((E, Tn), dtype=qkv.dtype)
        for j in range(Tn):
            for e in range(E):
                k[j, e] = qkv[b, j, ko + e]
                vt[e, j] = qkv[b, j, vo + e]
        s = np.empty((ROWS, tile), dtype=qkv.dtype)
        qb = np.empty((ROWS, E), dtype=qkv.dtype)
        acc = np.empty((ROWS, E), dtype=qkv.dtype)
        m = np.empty(ROWS, dtype=qkv.dtype)
        l = np.empty(ROWS, dtype=qkv.dtype)
        for i0 in range(0, Tn, ROWS):
            last = min(i0 + ROWS, Tn) - 1  # rows past the end repeat the last row, unwritten
            for r in range(ROWS):
                i = min(i0 + r, last)
                for e in range(E):
                    qb[r, e] = qkv[b, i, qo + e] * scale
                    acc[r, e] = T(0.0)
                m[r] = T(-np.inf)
                l[r] = T(0.0)
            for j0 in range(0, last + 1, tile):
                n = min(tile, last + 1 - j0)
                _scores8(s, qb, k, j0, n)
                _online_softmax8(s, acc, m, l, i0, last, j0, n)
                _accumulate8(acc, s, vt, j0, n)
            for r in range(min(ROWS, Tn - i0)):
                inv = T(1.0) / l[r]
                for e in range(E):
                    out[b, i0 + r, qo + e] = acc[r, e] * inv
                lse[b, h, i0 + r] = m[r] + math.log(l[r])


@njit(parallel=True, cache=True, fastmath=FAST, error_model="numpy")
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
        k = np.empty((Tn, E), dtype=qkv.dtype)
        kt = np.empty((E, Tn), dtype=qkv.dtype)
        v = np.empty((Tn, E), dtype=qkv.dtype)
        dk = np.zeros((Tn, E), dtype=qkv.dtype)
        dv = np.zeros((Tn, E), dtype=qkv.dtype)
        for j in range(Tn):
            for e in range(E):
                k[j, e] = qkv[b, j, ko + e]
                kt[e, j] = k[j, e]
                v[j, e] = qkv[b, j, vo + e]
        qb = np.empty((ROWS, E), dtype=qkv.dtype)
        dob = np.empty((ROWS, E), dtype=qkv.dtype)
        dq = np.empty((ROWS, E), dtype=qkv.dtype)
        s = np.empty((ROWS, tile), dtype=qkv.dtype)
        dp = np.empty((ROWS, tile), dtype=qkv.dtype)
        di = np.empty(ROWS, dtype=qkv.dtype)
        li = np.empty(ROWS, dtype=qkv.dtype)
        for hh in range(rep):
            h = g * rep + hh
            qo = h * E
            for i0 in range(0, Tn, ROWS):
                last = min(i0 + ROWS, Tn) - 1
                for r in range(ROWS):
                    i = min(i0 + r, last)
                    d = T(0.0)
                    for e in range(E):
                        qb[r, e] = qkv[b, i, qo + e]
                        dob[r, e] = dout[b, i, qo + e]
                        d += dob[r, e] * out[b, i, qo + e]
                        dq[r, e] = T(0.0)
                    di[r] = d
                    li[r] = lse[b, h, i]
                for j0 in range(0, last + 1, tile):
                    n = min(tile, last + 1 - j0)
                    _scores8(s, qb, k, j0, n)
                    _scores8(dp, dob, v, j0, n)
                    _softmax_grad8(s, dp, li, di, scale, i0, last, j0, n)
                    _accumulate8(dq, dp, kt, j0, n)
                    _rank8_update(dk, dp, qb, j0, n)  # dK += dS^T Q
                    _rank8_update(dv, s, dob, j0, n)  # dV += P^T dO
                for r in range(min(ROWS, Tn - i0)):
                    for e in range(E):
                        dqkv[b, i0 + r, qo + e] = dq[r, e]
        for j in range(Tn):
            for e in range(E):
                dqkv[b, j, ko + e] = dk[j, e]
                dqkv[b, j, vo + e] = dv[j, e]
