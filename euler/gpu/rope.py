"""Rotary position embedding on the GPU, in place on the q and k parts of fused qkv.

Where E/2 % 4 == 0 and the buffers are 16-byte aligned (the presets), each thread rotates
4 pairs per access (vector.py), in blocks that cover whole rows where they fit. On the H200
at the gpu preset's shape (B=32, T=512, 16 of its 20 heads rotated, 134 MB moved) a call
took 0.062 ms in 256-thread blocks of one row whose threads loop over heads (half of them
idle), 0.040 with a block's threads on one row's heads, 0.037 (3.7 TB/s) on two rows' with
no loops (bench/labs/rope_gpu.py, results/rope-s11-*).
"""

from __future__ import annotations

from numba import cuda

from euler.backend import check_shapes
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.vector import aligned4, load4, store4
from euler.layer_math import rope_rotate


@cuda.jit
def rope_kernel(qkv, cos, sin, n_qk_heads, pos0, sign):
    """Rotate pairs (i, i + E/2) of the first n_qk_heads heads of qkv (B, T, C) in place.

    cos, sin (context, E/2); sign is +1 (forward) or -1 (backward) in the working type.
    A block per (b, t) row, rows strided over the grid; thread (x, y) takes pairs x, x + X,
    ... of heads y, y + Y, ...: no thread divides a flat index (a 64-bit integer division
    per element cost more than the element's memory traffic).
    """
    B, Tn, _ = qkv.shape
    half = cos.shape[1]
    E = 2 * half
    row = cuda.blockIdx.x
    while row < B * Tn:
        b = row // Tn
        t = row - b * Tn
        for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
            c, s = cos[pos0 + t, i], sign * sin[pos0 + t, i]
            for h in range(cuda.threadIdx.y, n_qk_heads, cuda.blockDim.y):
                k = h * E + i
                x1, x2 = rope_rotate(qkv[b, t, k], qkv[b, t, k + half], c, s)
                qkv[b, t, k] = x1
                qkv[b, t, k + half] = x2
        row += cuda.gridDim.x


@cuda.jit(device=True)
def rotate4(qkv, k, half, cos, sin, at, sign):
    """Rotate pairs (k + j, k + half + j), j < 4, of flat qkv in place by the angles at
    cos[at + j], sign * sin[at + j]: 16-byte loads and stores."""
    c0, c1, c2, c3 = load4(cos, at)
    s0, s1, s2, s3 = load4(sin, at)
    a0, a1, a2, a3 = load4(qkv, k)
    b0, b1, b2, b3 = load4(qkv, k + half)
    a0, b0 = rope_rotate(a0, b0, c0, sign * s0)
    a1, b1 = rope_rotate(a1, b1, c1, sign * s1)
    a2, b2 = rope_rotate(a2, b2, c2, sign * s2)
    a3, b3 = rope_rotate(a3, b3, c3, sign * s3)
    store4(qkv, k, a0, a1, a2, a3)
    store4(qkv, k + half, b0, b1, b2, b3)


@cuda.jit
def rope_vec_kernel(qkv, cos, sin, C, Tn, half, n_qk_heads, pos0, sign):
    """rope_kernel on flat views qkv (B T C,), cos, sin (context E/2,), each thread rotating
    4 pairs per access (16-byte loads; E/2 % 4 == 0)."""
    E = 2 * half
    rows = qkv.shape[0] // C
    row = cuda.blockIdx.x
    while row < rows:
        t = row - row // Tn * Tn
        for i in range(4 * cuda.threadIdx.x, half, 4 * cuda.blockDim.x):
            for h in range(cuda.threadIdx.y, n_qk_heads, cuda.blockDim.y):
                rotate4(qkv, row * C + h * E + i, half, cos, sin, (pos0 + t) * half + i, sign)
        row += cuda.gridDim.x


@cuda.jit
def rope_rows_kernel(qkv, cos, sin, C, Tn, half, pos0, sign):
    """rope_vec_kernel without loops, for blocks (E / 8, heads, R) that cover R whole rows:
    thread (x, y, z) rotates pairs 4x..4x+3 of head y of row R blockIdx.x + z."""
    E = 2 * half
    row = cuda.blockIdx.x * cuda.blockDim.z + cuda.threadIdx.z
    if row < qkv.shape[0] // C:
        t = row - row // Tn * Tn
        i = 4 * cuda.threadIdx.x
        k = row * C + cuda.threadIdx.y * E + i
        rotate4(qkv, k, half, cos, sin, (pos0 + t) * half + i, sign)


def _rope(qkv, cos, sin, H, G, E, pos0, sign, stream, threads):
    B, Tn, C = qkv.shape
    check_shapes("rope", qkv=(qkv, (B, Tn, (H + 2 * G) * E)), sin=(sin, cos.shape))
    if cos.shape[1] != E // 2 or pos0 < 0 or pos0 + Tn > cos.shape[0]:
        raise ValueError(f"rope: tables {cos.shape} do not cover positions {pos0}..{pos0 + Tn - 1}")
    half, heads = E // 2, H + G
    if half % 4 == 0 and aligned4(qkv, cos, sin):
        flat = qkv.reshape(qkv.size), cos.reshape(cos.size), sin.reshape(sin.size)
        x = half // 4
        per = min(64, threads // (x * heads))  # whole rows a block (a block's z: 64 at most)
        if x <= 32 and per >= 1:  # blocks of (x, heads, per): every thread busy, no loops
            grid = (B * Tn + per - 1) // per
            rows = rope_rows_kernel[grid, (x, heads, per), stream]
            rows(*flat, C, Tn, half, pos0, sign)
            return
        x = min(32, x)
        block = (x, max(1, threads // x))
        rope_vec_kernel[grid_for(B * Tn, 1), block, stream](*flat, C, Tn, half, heads, pos0, sign)
        return
    x = min(32, half)
    block = (x, max(1, threads // x))
    rope_kernel[grid_for(B * Tn, 1), block, stream](qkv, cos, sin, heads, pos0, sign)


def rope_forward(qkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate q and k heads of qkv (B, T, (H+2G) E) in place; cos, sin (context, E/2)."""
    _rope(qkv, cos, sin, H, G, E, pos0, qkv.dtype.type(1.0), stream, threads)


def rope_backward(dqkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate the q and k gradients of dqkv (B, T, (H+2G) E) back, in place."""
    _rope(dqkv, cos, sin, H, G, E, pos0, dqkv.dtype.type(-1.0), stream, threads)
