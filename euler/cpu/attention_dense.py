"""Causal grouped-query attention for short sequences: whole score blocks through BLAS.

For T up to DENSE_MAX_T a head's T x T scores fit in a core's cache, and BLAS computes them
far faster than a hand-written tile loop: measured on this project's 2-core machine
(AVX-512), 32 products of 128 x 32 x 128 ran at about 110 GFLOP/s on one core, against
about 15 for FlashAttention's eight-row kernels, even though BLAS also computes the masked
part. A prange hands each (batch row, query head) to a thread in the forward, and each
(batch row, kv head) in the backward, whose query heads run one after another (they add
into the same dK and dV). A head costs two BLAS calls for the scores (the rows before T/2
see no key past T/2, so a quarter of the product is skipped), the softmax in a Numba loop,
two calls for P V. BLAS reads the heads in place in qkv (rows QKV elements apart) and writes
the output in place; only the scores live in the thread's scratch.

The results are those of the FlashAttention kernels (euler/cpu/attention.py), which remain
the path for longer sequences, up to rounding: out (B, T, H E) and lse (B, H, T) from qkv
(B, T, (H + 2G) E); query head h = g rep + r reads kv head g.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from euler.cpu.blas import gemm
from euler.layer_math import exp_, softmax_grad

DENSE_MAX_T = 512  # longest sequence computed here (two T x T buffers a thread: 2 MiB)
FAST = {"reassoc", "contract", "nsz", "arcp"}
LANES = 16  # float32 lanes of an AVX-512 register


@njit(inline="always")
def _padded(n, limit):
    """n rounded up to whole vectors of LANES, at most limit: the row loops below run over
    the padded length and then zero what lies past the diagonal, which spares LLVM's scalar
    remainder loop (measured: softmax 0.37 -> 0.29 ms for 8 x 4 heads at T = 128)."""
    return min(limit, (n + LANES - 1) // LANES * LANES)


@njit(nogil=True, cache=True)
def _causal(pa, lda, pb, ldb, pc, ldc, T, n, item, trans_b=False, scores=False):
    """Rows of a causal product C (T, n) = A op(B) in two BLAS calls, split at h = T/2.

    scores (C = S Q K^T-like, n = T): rows before h against the first h columns, the
    rest whole. Otherwise A is a (T, T) matrix zero above its diagonal applied to B (T, n):
    rows before h need only its first h columns."""
    h = T // 2
    double = item == 8
    if scores:
        gemm(h, h, n, pa, lda, pb, ldb, 0.0, pc, ldc, double, trans_b=trans_b)
        gemm(T - h, T, n, pa + item * h * lda, lda, pb, ldb, 0.0, pc + item * h * ldc, ldc,
             double, trans_b=trans_b)  # fmt: skip
    else:
        gemm(h, n, h, pa, lda, pb, ldb, 0.0, pc, ldc, double, trans_b=trans_b)
        gemm(T - h, n, T, pa + item * h * lda, lda, pb, ldb, 0.0, pc + item * h * ldc, ldc,
             double, trans_b=trans_b)  # fmt: skip


@njit(nogil=True, fastmath=FAST, error_model="numpy")
def _softmax_rows(s, inv, lse_row, scale):
    """s (T, T) scores becomes exp(scale (s - rowmax)), zero above the diagonal; inv (T,)
    each row's 1 / sum (applied to the output after P V, cheaper than a pass over P);
    lse_row (T,) = scale rowmax + log(sum)."""
    Tn = s.shape[0]
    T = s.dtype.type
    for i in range(Tn):
        row = s[i]
        m = row[0]
        for j in range(1, i + 1):
            m = max(m, row[j])
        padded = row[: _padded(i + 1, Tn)]
        for j in range(padded.shape[0]):
            padded[j] = exp_((padded[j] - m) * scale)
        row[i + 1 :] = T(0.0)
        total = T(0.0)
        for j in range(i + 1):
            total += row[j]
        inv[i] = T(1.0) / total
        lse_row[i] = m * scale + math.log(total)


@njit(nogil=True, fastmath=FAST, error_model="numpy")
def _softmax_grad_rows(s, dp, lse_row, do, o, scale):
    """s: scores -> P; dp: dO V^T -> dS = P (dP - rowsum(dO O)) scale; both (T, T), zero
    above the diagonal; do, o (T, E) the head's output gradient and output."""
    Tn, E = do.shape
    T = s.dtype.type
    for i in range(Tn):
        d = T(0.0)
        for e in range(E):
            d += do[i, e] * o[i, e]
        li = lse_row[i]
        n = _padded(i + 1, Tn)
        srow = s[i, :n]
        drow = dp[i, :n]
        for j in range(n):
            p = exp_(srow[j] * scale - li)
            srow[j] = p
            drow[j] = softmax_grad(p, drow[j], d) * scale
        s[i, i + 1 :] = T(0.0)
        dp[i, i + 1 :] = T(0.0)


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def attention_forward(out, lse, qkv, H, G, E):
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E).

    A thread takes a (batch row, query head) at a time: heads share nothing in the forward.
    """
    B, Tn, QKV = qkv.shape
    rep = H // G
    item = qkv.itemsize
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    for u in prange(B * H):
        b, h = u // H, u % H
        g = h // rep
        s = np.empty((Tn, Tn), qkv.dtype)
        inv = np.empty(Tn, qkv.dtype)
        base = qkv[b].ctypes.data
        _causal(base + item * h * E, QKV, base + item * (H + g) * E, QKV, s.ctypes.data, Tn,
                Tn, E, item, trans_b=True, scores=True)  # fmt: skip
        _softmax_rows(s, inv, lse[b, h], scale)
        _causal(s.ctypes.data, Tn, base + item * (H + G + g) * E, QKV,
                out[b].ctypes.data + item * h * E, H * E, Tn, E, item)  # fmt: skip
        o = out[b, :, h * E : (h + 1) * E]
        for i in range(Tn):
            f = inv[i]
            for e in range(E):
                o[i, e] *= f


@njit(nogil=True, cache=True)
def _transposed_causal(pa, lda, pb, ldb, pc, ldc, T, n, item, beta):
    """C (T, n) (+)= A^T B for A (T, T) zero above its diagonal, B (T, n): C's rows (A's
    columns) from h = T/2 on need only A's rows from h on."""
    h = T // 2
    double = item == 8
    gemm(h, n, T, pa, lda, pb, ldb, beta, pc, ldc, double, trans_a=True)
    gemm(T - h, n, T - h, pa + item * (h * lda + h), lda, pb + item * h * ldb, ldb, beta,
         pc + item * h * ldc, ldc, double, trans_a=True)  # fmt: skip


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def attention_backward(dqkv, dout, qkv, out, lse, H, G, E):
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    Per (batch row, kv head g), for each of its query heads in order: dQ_h = dS K_g,
    dV_g += P^T dO_h, dK_g += dS^T Q_h (the first head assigns, the others add).
    """
    B, Tn, QKV = qkv.shape
    rep = H // G
    item = qkv.itemsize
    HE = H * E
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    for u in prange(B * G):
        b, g = u // G, u % G
        s = np.empty((Tn, Tn), qkv.dtype)
        dp = np.empty((Tn, Tn), qkv.dtype)
        base, dbase = qkv[b].ctypes.data, dqkv[b].ctypes.data
        k_off, v_off = item * (H + g) * E, item * (H + G + g) * E
        for r in range(rep):
            h = g * rep + r
            pdo = dout[b].ctypes.data + item * h * E
            _causal(base + item * h * E, QKV, base + k_off, QKV, s.ctypes.data, Tn, Tn, E,
                    item, trans_b=True, scores=True)  # fmt: skip
            _causal(pdo, HE, base + v_off, QKV, dp.ctypes.data, Tn, Tn, E, item, trans_b=True,
                    scores=True)  # fmt: skip
            _softmax_grad_rows(s, dp, lse[b, h], dout[b, :, h * E : (h + 1) * E],
                               out[b, :, h * E : (h + 1) * E], scale)  # fmt: skip
            _causal(dp.ctypes.data, Tn, base + k_off, QKV, dbase + item * h * E, QKV, Tn, E,
                    item)  # fmt: skip
            beta = 0.0 if r == 0 else 1.0
            _transposed_causal(s.ctypes.data, Tn, pdo, HE, dbase + v_off, QKV, Tn, E, item, beta)
            _transposed_causal(dp.ctypes.data, Tn, base + item * h * E, QKV, dbase + k_off, QKV,
                               Tn, E, item, beta)  # fmt: skip
