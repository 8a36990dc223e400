"""Naive causal attention on the GPU, the baseline FlashAttention is measured against.

The (B H, T, T) scores live in device memory; the products are cuBLAS batched GEMMs (TF32
when the backend's are) and the softmax and its backward are one block per score row.
Used by `euler bench --device cuda` and bench/bench_gpu.py, never by training.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from euler.gpu.reduce import MAX_THREADS, block_max, block_sum


@cuda.jit
def causal_softmax_kernel(s, scale):
    """s (Z, T, T) scores -> causal softmax probabilities in place; one block per row."""
    Z, T, _ = s.shape
    buf = cuda.shared.array(MAX_THREADS, float32)
    z = cuda.blockIdx.y
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m = float32(-math.inf)
    for j in range(tid, i + 1, cuda.blockDim.x):
        m = max(m, s[z, i, j] * scale)
    m = block_max(m, buf, float32(-math.inf))
    acc = float32(0.0)
    for j in range(tid, i + 1, cuda.blockDim.x):
        acc += math.exp(s[z, i, j] * scale - m)
    acc = block_sum(acc, buf, float32(0.0))
    for j in range(tid, T, cuda.blockDim.x):
        s[z, i, j] = math.exp(s[z, i, j] * scale - m) / acc if j <= i else float32(0.0)


@cuda.jit
def softmax_backward_kernel(dp, p, scale):
    """dp (Z, T, T) = p (dp - rowsum(p dp)) * scale in place: dS from dP; one block per row."""
    Z, T, _ = dp.shape
    buf = cuda.shared.array(MAX_THREADS, float32)
    z = cuda.blockIdx.y
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    d = float32(0.0)
    for j in range(tid, i + 1, cuda.blockDim.x):
        d += p[z, i, j] * dp[z, i, j]
    d = block_sum(d, buf, float32(0.0))
    for j in range(tid, T, cuda.blockDim.x):
        dp[z, i, j] = p[z, i, j] * (dp[z, i, j] - d) * scale


class NaiveAttention:
    """Device operands for one (qkv, dout) pair: per (b, h) contiguous q, k, v, dO (kv heads
    repeated per query head), the scores and their gradient, (B H, T, T) each."""

    def __init__(self, be, qkv: np.ndarray, dout: np.ndarray, H: int, G: int, E: int):
        B, T, _ = qkv.shape
        self.be, self.shape = be, (B, T, H, E)
        heads = lambda a, n: a.reshape(B, T, n, E).transpose(0, 2, 1, 3)  # noqa: E731
        flat = lambda a: be.to_device(np.ascontiguousarray(a).reshape(B * H, T, E))  # noqa: E731
        self.q = flat(heads(qkv[:, :, : H * E], H))
        self.k = flat(np.repeat(heads(qkv[:, :, H * E : (H + G) * E], G), H // G, axis=1))
        self.v = flat(np.repeat(heads(qkv[:, :, (H + G) * E :], G), H // G, axis=1))
        self.do = flat(heads(dout, H))
        self.s, self.dp = (be.zeros((B * H, T, T), np.float32) for _ in range(2))
        self.o, self.dq, self.dk, self.dv = (be.zeros((B * H, T, E), np.float32) for _ in range(4))
        self.scale = np.float32(1 / math.sqrt(E))

    def forward(self) -> None:
        """o = softmax(q k^T / sqrt(E), causal) v; the probabilities stay in s."""
        be, grid = self.be, (self.shape[1], self.s.shape[0])
        be.matmul_batched(self.s, self.q, self.k, trans_b=True)
        causal_softmax_kernel[grid, 256, be.stream](self.s, self.scale)
        be.matmul_batched(self.o, self.s, self.v)

    def backward(self) -> None:
        """dq, dk, dv (per query head) from do and the forward's probabilities."""
        be, grid = self.be, (self.shape[1], self.s.shape[0])
        be.matmul_batched(self.dp, self.do, self.v, trans_b=True)
        softmax_backward_kernel[grid, 256, be.stream](self.dp, self.s, self.scale)
        be.matmul_batched(self.dq, self.dp, self.k)
        be.matmul_batched(self.dk, self.dp, self.q, trans_a=True)
        be.matmul_batched(self.dv, self.s, self.do, trans_a=True)

    def out(self) -> np.ndarray:
        """The forward's output as a host (B, T, H E) array."""
        B, T, H, E = self.shape
        o = self.be.to_host(self.o).reshape(B, H, T, E)
        return o.transpose(0, 2, 1, 3).reshape(B, T, H * E)

    def scores_bytes(self) -> int:
        """Bytes of one (B H, T, T) score tensor."""
        return self.s.size * 4
