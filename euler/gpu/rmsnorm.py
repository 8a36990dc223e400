"""RMSNorm on the GPU: one warp per row; dw from per-block partials, summed in a fixed order.

    kernel (forward / backward)            runs where
    rmsnorm_*_vec_kernel                   float32, D % 4 == 0, 16-byte aligned (every preset)
    rmsnorm_*_rows_vec_bf16_kernel         bf16, D = 256, 512 or 768 (the `gpu` preset's 768)
    rmsnorm_*_kernel                       anything else, float32 or bf16: the generic fallback
    sum_partials_kernel                    the backward's dw, after either

A warp reads a row in coalesced 128-byte lines and reduces it with shuffles, with no block
barrier on the way, so a multiprocessor keeps dozens of rows in flight; a block per row
waits on two barriers a row. The 16-byte kernels move 4 float32 columns a lane and access
(vector.py), the bf16 ones 8 (two float32 loads of x, w, dy beside one 16-byte bf16 access).

The backward gives each block a fixed slice of rows (`partial_rows`: two blocks a
multiprocessor, so that a block's dy and x rows are still in L1 for its second pass); each
warp sums its rows' dw terms in its own shared-memory row, the block adds its warps' rows in
order into its partial, and sum_partials_kernel adds the partials in order: no atomics, so
dw is the same every run.

Under bf16 (euler.precision) the forward's y and the backward's dres and dx are bf16 (uint16
bits); x, w, rstd, dy and dw stay float32, and the arithmetic is float32 through the same
layer_math helpers, each bf16 value widened where read and rounded once where stored. The
bf16 kernels are compiled for one row width D = 256 S (S strips of 8 columns a lane, S at
most 3 so that nothing spills), so that a lane keeps its 8 S columns in registers between a
row's two passes, and the backward its dw terms across rows, written to shared memory once
at the end: each row is read from memory once. The variant that reads a row twice, with the
same bits, is bench/labs/rmsnorm_bf16_backward_gpu.py's.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import cuda, float32, uint32

from euler.backend import check_shapes
from euler.gpu.bf16 import stored, widen
from euler.gpu.reduce import MAX_THREADS, WARP, sum_warp_rows, warp_sum_all
from euler.gpu.vector import (
    aligned4,
    aligned8_bf16,
    check_dtypes,
    load4,
    load4_u32,
    store4,
    store8_bf16,
    widen_high,
    widen_low,
)
from euler.layer_math import (
    rms_rstd,
    rmsnorm_backward_coefficient,
    rmsnorm_backward_element,
    rmsnorm_forward_element,
)
from euler.precision import BF16, is_bf16

WARPS = 8  # rows in flight per block
# backward blocks a multiprocessor: 16 rows in flight on each, whose dy and x rows the
# second pass finds in L1 (more blocks evict them: bench/labs/rmsnorm_gpu.py)
PARTIAL_BLOCKS_PER_SM = 2
SUM_WARPS = 8  # warps adding the partials of one 32-column strip
STRIP = 8 * WARP  # columns a warp covers in one step of a bf16 kernel: 8 a lane
MAX_STRIPS = 3  # 128 registers a thread at 3 (D = 768), none spilled


def block_warps(threads: int = 0) -> int:
    """Warps per block: WARPS, or fewer when a smaller block is asked for (the simulator)."""
    return max(1, min(WARPS, (threads or WARPS * WARP) // WARP))


@cuda.jit
def rmsnorm_forward_kernel(y, rstd, x, w, eps):
    """y (N, D) = x / rms(x) * w (D,), rstd (N,); one warp per row, rows strided over the grid.
    y float32 or bf16 (bf16.stored)."""
    N, D = x.shape
    T = x.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    lane = cuda.threadIdx.x % WARP
    warps = cuda.gridDim.x * (cuda.blockDim.x // WARP)
    n0 = cuda.blockIdx.x * (cuda.blockDim.x // WARP) + cuda.threadIdx.x // WARP
    # the same trip count in every warp: the simulator's warp sums are block barriers
    for n in range(n0, n0 + (N + warps - 1) // warps * warps, warps):
        s = T(0.0)
        if n < N:
            for d in range(lane, D, WARP):
                s += x[n, d] * x[n, d]
        s = warp_sum_all(s, buf, T(0.0))
        if n < N:
            r = rms_rstd(s, D, eps, T)
            for d in range(lane, D, WARP):
                y[n, d] = stored(y, rmsnorm_forward_element(x[n, d], r, w[d]))
            if lane == 0:
                rstd[n] = r


@cuda.jit
def rmsnorm_forward_vec_kernel(y, rstd, x, w, eps, D):
    """rmsnorm_forward_kernel on flat views y, x (N D,), each lane moving 4 columns per
    access (16-byte loads; D % 4 == 0)."""
    N = x.shape[0] // D
    T = x.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    lane = cuda.threadIdx.x % WARP
    warps = cuda.gridDim.x * (cuda.blockDim.x // WARP)
    n0 = cuda.blockIdx.x * (cuda.blockDim.x // WARP) + cuda.threadIdx.x // WARP
    for n in range(n0, n0 + (N + warps - 1) // warps * warps, warps):
        s = T(0.0)
        if n < N:
            for d in range(4 * lane, D, 4 * WARP):
                x0, x1, x2, x3 = load4(x, n * D + d)
                s += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
        s = warp_sum_all(s, buf, T(0.0))
        if n < N:
            r = rms_rstd(s, D, eps, T)
            for d in range(4 * lane, D, 4 * WARP):
                x0, x1, x2, x3 = load4(x, n * D + d)
                w0, w1, w2, w3 = load4(w, d)
                store4(
                    y, n * D + d,
                    rmsnorm_forward_element(x0, r, w0), rmsnorm_forward_element(x1, r, w1),
                    rmsnorm_forward_element(x2, r, w2), rmsnorm_forward_element(x3, r, w3),
                )  # fmt: skip
            if lane == 0:
                rstd[n] = r


def held_in_registers(D: int) -> bool:
    """Whether bf16 rows of D columns take the held-row kernels (D = STRIP S, S <= 3)."""
    return D % STRIP == 0 and D // STRIP <= MAX_STRIPS


@cache
def forward_kernel(D: int):
    """The bf16 forward for rows of D = STRIP S columns: one warp a row, its lane's 8 S
    columns of x held in registers between the sum and the store. y, x flat (N D,), y bf16."""
    S = D // STRIP
    C8 = 8 * S

    @cuda.jit
    def rmsnorm_forward_rows_vec_bf16_kernel(y, rstd, x, w, eps, D):
        N = x.shape[0] // D
        buf = cuda.shared.array(MAX_THREADS, float32)
        lane = cuda.threadIdx.x % WARP
        warps = cuda.gridDim.x * (cuda.blockDim.x // WARP)
        n0 = cuda.blockIdx.x * (cuda.blockDim.x // WARP) + cuda.threadIdx.x // WARP
        xs = cuda.local.array(C8, float32)
        for n in range(n0, n0 + (N + warps - 1) // warps * warps, warps):
            t = float32(0.0)
            if n < N:
                for s in range(S):
                    d, i = STRIP * s + 8 * lane, 8 * s
                    xs[i], xs[i + 1], xs[i + 2], xs[i + 3] = load4(x, n * D + d)
                    xs[i + 4], xs[i + 5], xs[i + 6], xs[i + 7] = load4(x, n * D + d + 4)
                    x0, x1, x2, x3 = xs[i], xs[i + 1], xs[i + 2], xs[i + 3]
                    x4, x5, x6, x7 = xs[i + 4], xs[i + 5], xs[i + 6], xs[i + 7]
                    t += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3  # the package's order
                    t += x4 * x4 + x5 * x5 + x6 * x6 + x7 * x7
            t = warp_sum_all(t, buf, float32(0.0))
            if n < N:
                r = rms_rstd(t, D, eps, float32)
                for s in range(S):
                    d, i = STRIP * s + 8 * lane, 8 * s
                    w0, w1, w2, w3 = load4(w, d)
                    w4, w5, w6, w7 = load4(w, d + 4)
                    store8_bf16(
                        y, n * D + d,
                        rmsnorm_forward_element(xs[i], r, w0),
                        rmsnorm_forward_element(xs[i + 1], r, w1),
                        rmsnorm_forward_element(xs[i + 2], r, w2),
                        rmsnorm_forward_element(xs[i + 3], r, w3),
                        rmsnorm_forward_element(xs[i + 4], r, w4),
                        rmsnorm_forward_element(xs[i + 5], r, w5),
                        rmsnorm_forward_element(xs[i + 6], r, w6),
                        rmsnorm_forward_element(xs[i + 7], r, w7),
                    )  # fmt: skip
                if lane == 0:
                    rstd[n] = r

    return rmsnorm_forward_rows_vec_bf16_kernel


@cache
def backward_kernel(D: int):
    """The bf16 backward for rows of D = STRIP S columns: one warp a row, its lane's 8 S
    columns of dy, x and the dres words held in registers between the row's two passes, and
    its dw terms across rows, written to shared memory once at the end. dx, dy, dres, x flat
    (N D,); dx, dres bf16; dx may alias dres."""
    S = D // STRIP
    C8, C4 = 8 * S, 4 * S

    @cuda.jit
    def rmsnorm_backward_rows_vec_bf16_kernel(dx, partial, dy, dres, x, w, rstd, D):
        N = x.shape[0] // D
        C = partial.shape[0]
        W = cuda.blockDim.x // WARP
        buf = cuda.shared.array(MAX_THREADS, float32)
        sacc = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        lane, q = tid % WARP, tid // WARP
        c = cuda.blockIdx.x
        g = cuda.local.array(C8, float32)
        xs = cuda.local.array(C8, float32)
        e = cuda.local.array(C4, uint32)
        acc = cuda.local.array(C8, float32)
        for j in range(C8):
            acc[j] = float32(0.0)
        r0, r1 = c * N // C, (c + 1) * N // C
        for n in range(r0 + q, r0 + q + (r1 - r0 + W - 1) // W * W, W):
            dot = float32(0.0)
            if n < r1:
                for s in range(S):
                    d = STRIP * s + 8 * lane
                    e[4 * s], e[4 * s + 1], e[4 * s + 2], e[4 * s + 3] = load4_u32(dres, n * D + d)
                    for h in range(0, 8, 4):
                        g0, g1, g2, g3 = load4(dy, n * D + d + h)
                        w0, w1, w2, w3 = load4(w, d + h)
                        x0, x1, x2, x3 = load4(x, n * D + d + h)
                        i = 8 * s + h
                        g[i], g[i + 1], g[i + 2], g[i + 3] = g0, g1, g2, g3
                        xs[i], xs[i + 1], xs[i + 2], xs[i + 3] = x0, x1, x2, x3
                        dot += g0 * w0 * x0 + g1 * w1 * x1 + g2 * w2 * x2 + g3 * w3 * x3
            dot = warp_sum_all(dot, buf, float32(0.0))
            if n < r1:
                r = rstd[n]
                k = rmsnorm_backward_coefficient(dot, r, D, float32)
                for s in range(S):
                    d = STRIP * s + 8 * lane
                    i = 8 * s
                    w0, w1, w2, w3 = load4(w, d)
                    w4, w5, w6, w7 = load4(w, d + 4)
                    v0, a0 = rmsnorm_backward_element(g[i], xs[i], w0, widen_low(e[4 * s]), r, k)
                    v1, a1 = rmsnorm_backward_element(g[i + 1], xs[i + 1], w1,
                                                      widen_high(e[4 * s]), r, k)  # fmt: skip
                    v2, a2 = rmsnorm_backward_element(g[i + 2], xs[i + 2], w2,
                                                      widen_low(e[4 * s + 1]), r, k)  # fmt: skip
                    v3, a3 = rmsnorm_backward_element(g[i + 3], xs[i + 3], w3,
                                                      widen_high(e[4 * s + 1]), r, k)  # fmt: skip
                    v4, a4 = rmsnorm_backward_element(g[i + 4], xs[i + 4], w4,
                                                      widen_low(e[4 * s + 2]), r, k)  # fmt: skip
                    v5, a5 = rmsnorm_backward_element(g[i + 5], xs[i + 5], w5,
                                                      widen_high(e[4 * s + 2]), r, k)  # fmt: skip
                    v6, a6 = rmsnorm_backward_element(g[i + 6], xs[i + 6], w6,
                                                      widen_low(e[4 * s + 3]), r, k)  # fmt: skip
                    v7, a7 = rmsnorm_backward_element(g[i + 7], xs[i + 7], w7,
                                                      widen_high(e[4 * s + 3]), r, k)  # fmt: skip
                    acc[i] += a0
                    acc[i + 1] += a1
                    acc[i + 2] += a2
                    acc[i + 3] += a3
                    acc[i + 4] += a4
                    acc[i + 5] += a5
                    acc[i + 6] += a6
                    acc[i + 7] += a7
                    store8_bf16(dx, n * D + d, v0, v1, v2, v3, v4, v5, v6, v7)
        for s in range(S):
            for j in range(8):
                sacc[q * D + STRIP * s + 8 * lane + j] = acc[8 * s + j]
        sum_warp_rows(partial, sacc, c, W, D, float32)

    return rmsnorm_backward_rows_vec_bf16_kernel


def rmsnorm_forward(y, rstd, x, w, eps, stream=0, threads: int = 0) -> None:
    """y (N, D) = x (N, D) / rms(x) * w (D,), assigned; rstd (N,) saved for the backward.

    y float32 or bf16; x, w, rstd float32. The kernel as the table at the top says."""
    N, D = x.shape
    check_shapes("rmsnorm_forward", y=(y, (N, D)), rstd=(rstd, (N,)), w=(w, (D,)))
    warps = block_warps(threads)
    grid = max(1, min((N + warps - 1) // warps, 65535))
    eps = x.dtype.type(eps)
    if is_bf16(y):
        check_dtypes("rmsnorm_forward", np.float32, rstd=rstd, x=x, w=w)
        if held_in_registers(D) and aligned8_bf16(y) and aligned4(x, w):
            flat = y.reshape(y.size), rstd, x.reshape(x.size), w
            forward_kernel(D)[grid, warps * WARP, stream](*flat, eps, D)
            return
    elif D % 4 == 0 and aligned4(y, x, w):
        flat = y.reshape(y.size), rstd, x.reshape(x.size), w
        rmsnorm_forward_vec_kernel[grid, warps * WARP, stream](*flat, eps, D)
        return
    rmsnorm_forward_kernel[grid, warps * WARP, stream](y, rstd, x, w, eps)


@cuda.jit(device=True, inline=True)
def _zero_warp_row(acc, q, D, lane, T):
    """acc[q D : (q + 1) D] = 0, by the 32 lanes of warp q."""
    for d in range(lane, D, WARP):
        acc[q * D + d] = T(0.0)


@cuda.jit
def rmsnorm_backward_kernel(dx, partial, dy, dres, x, w, rstd):
    """dx (N, D) = dres + J^T dy; partial (C, D) = sum over block c's rows of dy x rstd.

    Block c owns rows [c N / C, (c + 1) N / C); its warp q takes every W-th of them and
    sums dw in acc[q D : (q + 1) D] (dynamic shared memory, W D floats). dx may alias dres;
    both float32 or both bf16 (bf16.widen, bf16.stored).
    """
    N, D = x.shape
    C = partial.shape[0]
    T = x.dtype.type
    W = cuda.blockDim.x // WARP
    buf = cuda.shared.array(MAX_THREADS, float32)
    acc = cuda.shared.array(0, float32)
    tid = cuda.threadIdx.x
    lane, q = tid % WARP, tid // WARP
    c = cuda.blockIdx.x
    _zero_warp_row(acc, q, D, lane, T)
    r0, r1 = c * N // C, (c + 1) * N // C
    for n in range(r0 + q, r0 + q + (r1 - r0 + W - 1) // W * W, W):
        dot = T(0.0)
        if n < r1:
            for d in range(lane, D, WARP):
                dot += dy[n, d] * w[d] * x[n, d]
        dot = warp_sum_all(dot, buf, T(0.0))
        if n < r1:
            r = rstd[n]
            k = rmsnorm_backward_coefficient(dot, r, D, T)
            for d in range(lane, D, WARP):
                e = widen(dres[n, d])
                dxd, dwd = rmsnorm_backward_element(dy[n, d], x[n, d], w[d], e, r, k)
                acc[q * D + d] += dwd
                dx[n, d] = stored(dx, dxd)
    sum_warp_rows(partial, acc, c, W, D, T)


@cuda.jit
def rmsnorm_backward_vec_kernel(dx, partial, dy, dres, x, w, rstd, D):
    """rmsnorm_backward_kernel on flat views dx, dy, dres, x (N D,), each lane moving 4
    columns per access (16-byte loads; D % 4 == 0). dx may alias dres."""
    N = x.shape[0] // D
    C = partial.shape[0]
    T = x.dtype.type
    W = cuda.blockDim.x // WARP
    buf = cuda.shared.array(MAX_THREADS, float32)
    acc = cuda.shared.array(0, float32)
    tid = cuda.threadIdx.x
    lane, q = tid % WARP, tid // WARP
    c = cuda.blockIdx.x
    _zero_warp_row(acc, q, D, lane, T)
    r0, r1 = c * N // C, (c + 1) * N // C
    for n in range(r0 + q, r0 + q + (r1 - r0 + W - 1) // W * W, W):
        dot = T(0.0)
        if n < r1:
            for d in range(4 * lane, D, 4 * WARP):
                g0, g1, g2, g3 = load4(dy, n * D + d)
                w0, w1, w2, w3 = load4(w, d)
                x0, x1, x2, x3 = load4(x, n * D + d)
                dot += g0 * w0 * x0 + g1 * w1 * x1 + g2 * w2 * x2 + g3 * w3 * x3
        dot = warp_sum_all(dot, buf, T(0.0))
        if n < r1:
            r = rstd[n]
            k = rmsnorm_backward_coefficient(dot, r, D, T)
            for d in range(4 * lane, D, 4 * WARP):
                g0, g1, g2, g3 = load4(dy, n * D + d)
                w0, w1, w2, w3 = load4(w, d)
                x0, x1, x2, x3 = load4(x, n * D + d)
                e0, e1, e2, e3 = load4(dres, n * D + d)
                e0, a0 = rmsnorm_backward_element(g0, x0, w0, e0, r, k)
                e1, a1 = rmsnorm_backward_element(g1, x1, w1, e1, r, k)
                e2, a2 = rmsnorm_backward_element(g2, x2, w2, e2, r, k)
                e3, a3 = rmsnorm_backward_element(g3, x3, w3, e3, r, k)
                a = q * D + d
                acc[a] += a0
                acc[a + 1] += a1
                acc[a + 2] += a2
                acc[a + 3] += a3
                store4(dx, n * D + d, e0, e1, e2, e3)
    sum_warp_rows(partial, acc, c, W, D, T)


@cuda.jit
def sum_partials_kernel(dw, partial, accumulate):
    """dw (D,) (+)= sum over c of partial (C, D); block: 32 columns, warp q adds rows q::W.

    The warps' sums meet in shared memory and are added in warp order: a fixed order.
    """
    C, D = partial.shape
    T = dw.dtype.type
    part = cuda.shared.array((SUM_WARPS, WARP), float32)
    lane, q = cuda.threadIdx.x % WARP, cuda.threadIdx.x // WARP
    W = cuda.blockDim.x // WARP
    d = cuda.blockIdx.x * WARP + lane
    s = T(0.0)
    if d < D:
        for c in range(q, C, W):
            s += partial[c, d]
    part[q, lane] = s
    cuda.syncthreads()
    if q == 0 and d < D:
        s = T(0.0)
        for qq in range(W):
            s += part[qq, lane]
        if accumulate:
            dw[d] += s
        else:
            dw[d] = s


def partial_rows(N: int, blocks: int) -> int:
    """Row chunks (C) of the backward, one block each: at most `blocks` (the backend's
    PARTIAL_BLOCKS_PER_SM times its multiprocessors), at most N."""
    return max(1, min(N, blocks))


def rmsnorm_backward(
    dx, dw, dy, dres, x, w, rstd, accumulate, partial, stream=0, threads: int = 0
) -> None:
    """dx (N, D) = dres + J^T dy, assigned; dw (D,) (+)= sum_n dy x rstd (+= if accumulate).

    dx may alias dres. partial is (C, D) scratch, one row a block (partial_rows). dx and
    dres both float32 or both bf16; dy, x, w, rstd, dw and partial float32.
    """
    N, D = x.shape
    check_shapes("rmsnorm_backward", dx=(dx, (N, D)), dy=(dy, (N, D)), dres=(dres, (N, D)),
                 rstd=(rstd, (N,)), w=(w, (D,)), dw=(dw, (D,)),
                 partial=(partial, (partial.shape[0], D)))  # fmt: skip
    warps = block_warps(threads)
    nbytes = warps * D * 4
    if nbytes > 48 * 1024:
        raise ValueError(f"rmsnorm_backward: hidden size {D} too large for {warps} warps")
    C = partial.shape[0]
    launch = (C, warps * WARP, stream, nbytes)
    if is_bf16(dx):
        check_dtypes("rmsnorm_backward", BF16, dres=dres)
        check_dtypes("rmsnorm_backward", np.float32, dw=dw, dy=dy, x=x, w=w, rstd=rstd,
                     partial=partial)  # fmt: skip
        kernel = backward_kernel(D) if held_in_registers(D) else None
        vec = aligned8_bf16(dx, dres) and aligned4(dy, x, w)
    else:
        kernel = rmsnorm_backward_vec_kernel if D % 4 == 0 else None
        vec = aligned4(dx, dy, dres, x, w)
    if kernel is not None and vec:
        flat = [a.reshape(a.size) for a in (dx, dy, dres, x)]
        kernel[launch](flat[0], partial, flat[1], flat[2], flat[3], w, rstd, D)
    else:
        rmsnorm_backward_kernel[launch](dx, partial, dy, dres, x, w, rstd)
    sw = min(SUM_WARPS, warps)
    grid = (D + WARP - 1) // WARP
    sum_partials_kernel[grid, sw * WARP, stream](dw, partial, np.bool_(accumulate))
