"""Causal grouped-query attention for short sequences: whole score blocks through BLAS.

For T up to DENSE_MAX_T the T x T scores of a few (batch, head) pairs at a time fit in the
caches, and NumPy's batched sgemm computes them far faster than a hand-written tile loop:
measured on this project's 2-core machine (AVX-512), 32 products of 128 x 32 x 128 ran at
about 110 GFLOP/s on one core, against about 15 for FlashAttention's eight-row kernels,
even though BLAS also computes the masked half. The softmax and its gradient run in
serial Numba kernels on the same thread. The workers of the backend's pool take chunks of
batch rows that bound their scratch (CHUNK_BYTES per score buffer); the pool's threads
sleep when idle, like the matrix products'.

The results are those of the FlashAttention kernels (euler/cpu/attention.py), which remain
the path for longer sequences, up to rounding: out (B, T, H E) and lse (B, H, T) from qkv
(B, T, (H + 2G) E); query head h = g rep + r reads kv head g.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from euler.layer_math import exp_

DENSE_MAX_T = 256  # longest sequence computed here
CHUNK_BYTES = 1 << 20  # one worker's score buffer: one core's L2 here
FAST = {"reassoc", "contract", "nsz", "arcp"}
LANES = 16  # float32 lanes of an AVX-512 register


@njit(inline="always")
def _padded(n, limit):
    """n rounded up to whole vectors of LANES, at most limit: the row loops below run over
    the padded length and then zero what lies past the diagonal, which spares LLVM's scalar
    remainder loop (measured: softmax 0.37 -> 0.29 ms for 8 x 4 heads at T = 128)."""
    return min(limit, (n + LANES - 1) // LANES * LANES)


@njit(nogil=True, cache=True, fastmath=FAST, error_model="numpy")
def _softmax(s, inv, lse, b0, scale):
    """s (nb, G, rep, T, T) scores becomes exp(scale (s - rowmax)), zero above the diagonal.

    inv (nb, G, rep, T) gets each row's 1 / sum, applied to the output after P V, which is
    cheaper than a pass over P; lse[b0 + b] (B, H, T) is assigned.
    """
    nb, G, rep, Tn, _ = s.shape
    T = s.dtype.type
    for b in range(nb):
        for g in range(G):
            for r in range(rep):
                for i in range(Tn):
                    row = s[b, g, r, i]
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
                    inv[b, g, r, i] = T(1.0) / total
                    lse[b0 + b, g * rep + r, i] = m * scale + math.log(total)


@njit(nogil=True, cache=True, error_model="numpy")
def _normalise(out, inv, b0):
    """out[b0 + b, i, head h's E columns] *= inv[b, g, r, i] with h = g rep + r."""
    nb, G, rep, Tn = inv.shape
    E = out.shape[2] // (G * rep)
    for b in range(nb):
        for i in range(Tn):
            row = out[b0 + b, i]
            for g in range(G):
                for r in range(rep):
                    head = row[(g * rep + r) * E : (g * rep + r + 1) * E]
                    f = inv[b, g, r, i]
                    for e in range(E):
                        head[e] *= f


@njit(nogil=True, cache=True, fastmath=FAST, error_model="numpy")
def _softmax_grad(s, dp, lse, dout, out, b0, scale):
    """s: scores -> P; dp: dO V^T -> dS = P (dP - rowsum(dO O)) scale; both (nb, G, rep, T, T)."""
    nb, G, rep, Tn, _ = s.shape
    E = dout.shape[2] // (G * rep)
    T = s.dtype.type
    for b in range(nb):
        for g in range(G):
            for r in range(rep):
                c0 = (g * rep + r) * E
                for i in range(Tn):
                    do = dout[b0 + b, i, c0 : c0 + E]
                    o = out[b0 + b, i, c0 : c0 + E]
                    d = T(0.0)
                    for e in range(E):
                        d += do[e] * o[e]
                    li = lse[b0 + b, g * rep + r, i]
                    n = _padded(i + 1, Tn)
                    srow = s[b, g, r, i, :n]
                    drow = dp[b, g, r, i, :n]
                    for j in range(n):
                        p = exp_(srow[j] * scale - li)
                        srow[j] = p
                        drow[j] = p * (drow[j] - d) * scale
                    s[b, g, r, i, i + 1 :] = T(0.0)
                    dp[b, g, r, i, i + 1 :] = T(0.0)


def _views(a, H, G, E):
    """Views of a (B, T, (H + 2G) E): q (B, G, rep, T, E), k and v (B, G, T, E)."""
    B, T, _ = a.shape
    q = a[:, :, : H * E].reshape(B, T, G, H // G, E).transpose(0, 2, 3, 1, 4)
    k = a[:, :, H * E : (H + G) * E].reshape(B, T, G, E).transpose(0, 2, 1, 3)
    v = a[:, :, (H + G) * E :].reshape(B, T, G, E).transpose(0, 2, 1, 3)
    return q, k, v


def _scores(a, bt, out, h) -> None:
    """out (..., T, T) = a (..., T, E) @ bt (..., E, T), but rows before h only for keys
    before h: the causal mask discards the rest, so a quarter of the product is skipped."""
    np.matmul(a[..., :h, :], bt[..., :h], out=out[..., :h, :h])
    np.matmul(a[..., h:, :], bt, out=out[..., h:, :])


def _causal_apply(p, b, out, h) -> None:
    """out (..., T, E) = p (..., T, T) @ b (..., T, E) for p zero above the diagonal."""
    np.matmul(p[..., :h, :h], b[..., :h, :], out=out[..., :h, :])
    np.matmul(p[..., h:, :], b, out=out[..., h:, :])


class DenseAttention:
    """The forward and backward passes, with scratch buffers kept per worker and shape.

    `run(fn, n)` calls fn(lo, hi) over blocks of range(n) concurrently (the backend's pool);
    with n = slots, each call is one worker, which takes chunks of batch rows (sized to
    bound the scratch) from a shared iterator until none are left, so that a worker slowed
    by another process leaves its share to the others. Transposed operands are copied to
    contiguous scratch first: NumPy's batched matmul ran about 40% slower on a transposed
    view of qkv.
    """

    def __init__(self, run, slots: int):
        self.run = run
        self.slots = slots
        self.scratch: dict = {}

    def _buffers(self, slot, nb, n, G, rep, T, E, dtype) -> dict:
        """The first n of nb batch rows of worker `slot`'s buffers, allocated on first use."""
        key = (slot, nb, G, rep, T, E, np.dtype(dtype))
        if key not in self.scratch:
            self.scratch[key] = {
                "s": np.empty((nb, G, rep, T, T), dtype),  # scores, then P
                "dp": np.empty((nb, G, rep, T, T), dtype),  # dO V^T, then dS
                "heads": np.empty((nb, G, rep, T, E), dtype),  # packed q or dO heads
                "kvt": np.empty((nb, G, 1, E, T), dtype),  # K^T or V^T
                "inv": np.empty((nb, G, rep, T), dtype),  # 1 / softmax row sums
            }
        return {name: a[:n] for name, a in self.scratch[key].items()}

    @staticmethod
    def _chunk(B, H, T, itemsize) -> int:
        return max(1, min(B, CHUNK_BYTES // (H * T * T * itemsize)))

    def forward(self, out, lse, qkv, H, G, E) -> None:
        """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E)."""
        B, T, _ = qkv.shape
        rep = H // G
        scale = qkv.dtype.type(1.0 / math.sqrt(E))
        q, k, v = _views(qkv, H, G, E)
        o = out.reshape(B, T, G, rep, E).transpose(0, 2, 3, 1, 4)
        nb = self._chunk(B, H, T, qkv.itemsize)
        h = T // 2  # rows before h see no key past h

        chunks = iter(range(0, B, nb))  # next() on it is atomic under the GIL

        def worker(slot, _):
            for b0 in chunks:
                b1 = min(b0 + nb, B)
                buf = self._buffers(slot, nb, b1 - b0, G, rep, T, E, qkv.dtype)
                np.copyto(buf["kvt"][:, :, 0], k[b0:b1].transpose(0, 1, 3, 2))
                _scores(q[b0:b1], buf["kvt"], buf["s"], h)
                _softmax(buf["s"], buf["inv"], lse, b0, scale)
                _causal_apply(buf["s"], v[b0:b1, :, None], o[b0:b1], h)
                _normalise(out, buf["inv"], b0)

        self.run(worker, self.slots)

    def backward(self, dqkv, dout, qkv, out, lse, H, G, E) -> None:
        """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

        dV_g = sum_r P_r^T dO_r and dK_g = sum_r dS_r^T Q_r run as one product each, over
        the rep query heads' rows packed one after another.
        """
        B, T, _ = qkv.shape
        rep = H // G
        scale = qkv.dtype.type(1.0 / math.sqrt(E))
        q, k, v = _views(qkv, H, G, E)
        dq, dk, dv = _views(dqkv, H, G, E)
        do = dout.reshape(B, T, G, rep, E).transpose(0, 2, 3, 1, 4)
        nb = self._chunk(B, H, T, qkv.itemsize)
        h = T // 2

        chunks = iter(range(0, B, nb))

        def worker(slot, _):
            for b0 in chunks:
                b1 = min(b0 + nb, B)
                n = b1 - b0
                buf = self._buffers(slot, nb, n, G, rep, T, E, qkv.dtype)
                s, dp, heads, kvt = buf["s"], buf["dp"], buf["heads"], buf["kvt"]
                np.copyto(kvt[:, :, 0], k[b0:b1].transpose(0, 1, 3, 2))
                _scores(q[b0:b1], kvt, s, h)
                np.copyto(kvt[:, :, 0], v[b0:b1].transpose(0, 1, 3, 2))
                _scores(do[b0:b1], kvt, dp, h)
                _softmax_grad(s, dp, lse, dout, out, b0, scale)
                # rows (r, i) of P and dS are contiguous per group: (rep T, T) matrices
                np.copyto(heads, do[b0:b1])
                np.matmul(
                    s.reshape(n, G, rep * T, T).transpose(0, 1, 3, 2),
                    heads.reshape(n, G, rep * T, E),
                    out=dv[b0:b1],
                )
                _causal_apply(dp, k[b0:b1, :, None], dq[b0:b1], h)
                np.copyto(heads, q[b0:b1])
                np.matmul(
                    dp.reshape(n, G, rep * T, T).transpose(0, 1, 3, 2),
                    heads.reshape(n, G, rep * T, E),
                    out=dk[b0:b1],
                )

        self.run(worker, self.slots)
