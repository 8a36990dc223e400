"""Rotary position embedding on the GPU, in place on the q and k parts of fused qkv.

    kernel                   runs where
    rope_rows_kernel         float32, E/2 % 4 == 0, 16-byte aligned, whole rows a block
    rope_rows_bf16_kernel    bf16 (either direction), E/2 % 8 == 0, aligned, whole rows
    rope_kernel              float32 anywhere else: the generic fallback
    rope_bf16_kernel         bf16 anywhere else: the generic fallback of the bf16 pair

Where E/2 % 4 == 0 and the buffers are 16-byte aligned (the presets), each thread rotates
4 pairs per access (vector.py), in blocks that cover whole rows (every preset's rows fit):
a block's threads on whole rows' heads with no loops, so that no thread idles, where a
block of one row whose threads loop over heads leaves half of them idle
(bench/labs/rope_gpu.py keeps that looping kernel).

bf16 (--precision bf16): the forward rotates bf16 qkv in place; the backward reads the
float32 dqkv (attention's backward adds dQ into it by float atomics) and writes the rotated
gradient to a bf16 `out` (v heads copied), dqkv untouched. Both widen to float32, rotate,
and round once where stored (layer_math). Where E/2 % 8 == 0, the buffers are 16-byte
aligned and a block holds whole rows (every preset), a thread rotates 8 pairs per access:
one 16-byte access of bf16, two of float32 (vector.py); other shapes take the scalar path.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types
from numba.extending import overload

from euler.backend import check_shapes
from euler.gpu.bf16 import widen
from euler.gpu.memory import THREADS, grid_for
from euler.gpu.vector import aligned4, aligned8_bf16, load4, load8_bf16, store4, store8_bf16
from euler.layer_math import bf16_round, rope_rotate
from euler.precision import is_bf16


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
def rope_rows_kernel(qkv, cos, sin, C, Tn, half, pos0, sign):
    """rope_kernel on flat views qkv (B T C,), cos, sin (context E/2,), each thread rotating
    4 pairs per access (16-byte loads; E/2 % 4 == 0), for blocks (E / 8, heads, R) that
    cover R whole rows, with no loops: thread (x, y, z) rotates pairs 4x..4x+3 of head y of
    row R blockIdx.x + z."""
    E = 2 * half
    row = cuda.blockIdx.x * cuda.blockDim.z + cuda.threadIdx.z
    if row < qkv.shape[0] // C:
        t = row - row // Tn * Tn
        i = 4 * cuda.threadIdx.x
        k = row * C + cuda.threadIdx.y * E + i
        rotate4(qkv, k, half, cos, sin, (pos0 + t) * half + i, sign)


# ---------------------------------------------------------------- bf16
# src is the bf16 qkv itself (the forward, in place) or the float32 dqkv (the backward into
# a bf16 out): these read either as float32, chosen by the array's type when compiled.


def _load8(ary, k):
    """ary[k : k + 8] of a flat array as 8 float32: one 16-byte load of bf16, two of
    float32 (the simulator runs this)."""
    if is_bf16(ary):
        return load8_bf16(ary, k)
    return load4(ary, k) + load4(ary, k + 4)


@overload(_load8, target="cuda")
def _load8_overload(ary, k):
    if ary.dtype == types.uint16:
        return lambda ary, k: load8_bf16(ary, k)
    return lambda ary, k: load4(ary, k) + load4(ary, k + 4)


@cuda.jit
def rope_bf16_kernel(dst, src, cos, sin, n_rot, n_heads, pos0, sign):
    """rope_kernel from src into bf16 dst (B, T, C): pairs (i, i + E/2) of heads h < n_rot
    rotated, heads n_rot <= h < n_heads copied; src bf16 (dst itself) or float32. One
    element per access: the scalar path."""
    B, Tn, _ = dst.shape
    half = cos.shape[1]
    E = 2 * half
    row = cuda.blockIdx.x
    while row < B * Tn:
        b = row // Tn
        t = row - b * Tn
        for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
            c, s = cos[pos0 + t, i], sign * sin[pos0 + t, i]
            for h in range(cuda.threadIdx.y, n_heads, cuda.blockDim.y):
                k = h * E + i
                x1, x2 = widen(src[b, t, k]), widen(src[b, t, k + half])
                if h < n_rot:
                    x1, x2 = rope_rotate(x1, x2, c, s)
                dst[b, t, k] = bf16_round(x1)
                dst[b, t, k + half] = bf16_round(x2)
        row += cuda.gridDim.x


@cuda.jit(device=True)
def rotate8(dst, src, k, half, cos, sin, at, sign):
    """Rotate pairs (k + j, k + half + j), j < 8, of flat src into bf16 dst by the angles
    at cos[at + j], sign * sin[at + j]: 16-byte accesses."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _load8(src, k)
    b0, b1, b2, b3, b4, b5, b6, b7 = _load8(src, k + half)
    c0, c1, c2, c3 = load4(cos, at)
    c4, c5, c6, c7 = load4(cos, at + 4)
    s0, s1, s2, s3 = load4(sin, at)
    s4, s5, s6, s7 = load4(sin, at + 4)
    a0, b0 = rope_rotate(a0, b0, c0, sign * s0)
    a1, b1 = rope_rotate(a1, b1, c1, sign * s1)
    a2, b2 = rope_rotate(a2, b2, c2, sign * s2)
    a3, b3 = rope_rotate(a3, b3, c3, sign * s3)
    a4, b4 = rope_rotate(a4, b4, c4, sign * s4)
    a5, b5 = rope_rotate(a5, b5, c5, sign * s5)
    a6, b6 = rope_rotate(a6, b6, c6, sign * s6)
    a7, b7 = rope_rotate(a7, b7, c7, sign * s7)
    store8_bf16(dst, k, a0, a1, a2, a3, a4, a5, a6, a7)
    store8_bf16(dst, k + half, b0, b1, b2, b3, b4, b5, b6, b7)


@cuda.jit(device=True)
def copy8(dst, src, k, half):
    """Pairs (k + j, k + half + j), j < 8, of flat src into bf16 dst unrotated (v heads)."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _load8(src, k)
    b0, b1, b2, b3, b4, b5, b6, b7 = _load8(src, k + half)
    store8_bf16(dst, k, a0, a1, a2, a3, a4, a5, a6, a7)
    store8_bf16(dst, k + half, b0, b1, b2, b3, b4, b5, b6, b7)


@cuda.jit
def rope_rows_bf16_kernel(dst, src, cos, sin, C, Tn, half, n_rot, pos0, sign):
    """rope_rows_kernel from flat src into flat bf16 dst (B T C,), 8 pairs a thread, for
    blocks (E / 16, n_heads, R) that cover R whole rows: heads y < n_rot rotated, the others
    copied (E/2 % 8 == 0)."""
    E = 2 * half
    row = cuda.blockIdx.x * cuda.blockDim.z + cuda.threadIdx.z
    if row < dst.shape[0] // C:
        t = row - row // Tn * Tn
        i = 8 * cuda.threadIdx.x
        k = row * C + cuda.threadIdx.y * E + i
        if cuda.threadIdx.y < n_rot:
            rotate8(dst, src, k, half, cos, sin, (pos0 + t) * half + i, sign)
        else:
            copy8(dst, src, k, half)


def _check_tables(x, cos, sin, H, G, E, pos0) -> None:
    """ValueError unless x is (B, T, (H+2G) E) and cos, sin (context, E/2) float32 tables
    covering positions pos0 .. pos0 + T - 1."""
    B, Tn, C = x.shape
    check_shapes("rope", qkv=(x, (B, Tn, (H + 2 * G) * E)), sin=(sin, cos.shape))
    if cos.dtype != np.float32 or sin.dtype != np.float32:
        raise ValueError(f"rope: cos, sin are {cos.dtype}, {sin.dtype}; float32 expected")
    if cos.shape[1] != E // 2 or pos0 < 0 or pos0 + Tn > cos.shape[0]:
        raise ValueError(f"rope: tables {cos.shape} do not cover positions {pos0}..{pos0 + Tn - 1}")


def _rope(qkv, cos, sin, H, G, E, pos0, sign, stream, threads):
    B, Tn, C = qkv.shape
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
    x = min(32, half)
    block = (x, max(1, threads // x))
    rope_kernel[grid_for(B * Tn, 1), block, stream](qkv, cos, sin, heads, pos0, sign)


def _rope_bf16(dst, src, cos, sin, H, G, E, pos0, n_heads, sign, stream, threads):
    """The bf16 kernels: heads < H + G of src rotated into bf16 dst, the rest of the first
    n_heads copied (src is dst, or float32)."""
    B, Tn, C = dst.shape
    half, n_rot = E // 2, H + G
    x = half // 8
    src_ok = aligned8_bf16(src) if is_bf16(src) else aligned4(src)
    vec = half % 8 == 0 and x <= 32 and src_ok and aligned8_bf16(dst) and aligned4(cos, sin)
    per = min(64, threads // (x * n_heads)) if vec else 0  # whole rows a block, as in _rope
    if per >= 1:
        flat = [a.reshape(a.size) for a in (dst, src, cos, sin)]
        rows = rope_rows_bf16_kernel[(B * Tn + per - 1) // per, (x, n_heads, per), stream]
        rows(*flat, C, Tn, half, n_rot, pos0, sign)
        return
    x = min(32, half)
    block = (x, max(1, threads // x))
    rope_bf16_kernel[grid_for(B * Tn, 1), block, stream](dst, src, cos, sin, n_rot, n_heads,
                                                         pos0, sign)  # fmt: skip


def rope_forward(qkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS) -> None:
    """Rotate q and k heads of qkv (B, T, (H+2G) E) in place; cos, sin (context, E/2)
    float32. qkv float32, or bf16 (uint16 bits: widened, rotated, rounded once)."""
    _check_tables(qkv, cos, sin, H, G, E, pos0)
    if is_bf16(qkv):
        one = np.float32(1.0)
        _rope_bf16(qkv, qkv, cos, sin, H, G, E, pos0, H + G, one, stream, threads)
        return
    if qkv.dtype != np.float32:
        raise ValueError(f"rope_forward: qkv is {qkv.dtype}; float32 or bf16 expected")
    _rope(qkv, cos, sin, H, G, E, pos0, qkv.dtype.type(1.0), stream, threads)


def rope_backward(
    dqkv, cos, sin, H, G, E, pos0=0, stream=0, threads: int = THREADS, out=None
) -> None:
    """Rotate the q and k gradients of float32 dqkv (B, T, (H+2G) E) back: in place, or
    with out (dqkv's shape, bf16) into out, v heads copied and dqkv only read."""
    _check_tables(dqkv, cos, sin, H, G, E, pos0)
    if dqkv.dtype != np.float32:
        raise ValueError(f"rope_backward: dqkv is {dqkv.dtype}; float32 expected")
    if out is None:
        _rope(dqkv, cos, sin, H, G, E, pos0, dqkv.dtype.type(-1.0), stream, threads)
        return
    check_shapes("rope_backward", out=(out, dqkv.shape))
    if not is_bf16(out):
        raise ValueError(f"rope_backward: out is {out.dtype}; bf16 (uint16 bits) expected")
    minus = np.float32(-1.0)
    _rope_bf16(out, dqkv, cos, sin, H, G, E, pos0, H + 2 * G, minus, stream, threads)
