"""RMSNorm on the GPU: one warp per row; dw from per-block partials, summed in a fixed order.

A row of the `gpu` preset is 768 floats, 24 per lane: a warp reads it in coalesced
128-byte lines and reduces with shuffles, with no block barrier on the way, so a
multiprocessor keeps dozens of rows in flight (one block per row, the first version,
waited on two barriers per row and ran at a fifth of the memory bandwidth).

The backward gives each block a fixed slice of rows; each warp sums its rows' dw terms
in its own shared-memory row, the block adds its warps' rows in order into its partial,
and a second kernel adds the partials in order: no atomics, so dw is the same every run.

Where D % 4 == 0 and the buffers are 16-byte aligned (always, at the presets), each lane
moves 4 columns per access (vector.py): 6 such loads per lane cover a `gpu` row.

Under bf16 (euler.precision) the forward's y and the backward's dres and dx are bf16
(uint16 bits); x, w, rstd, dy and dw stay float32, and the arithmetic is float32 through the
same layer_math helpers, each bf16 value widened where read and rounded once where stored.
Their 16-byte kernels (D % 8 == 0) move 8 columns a lane and step, so that a bf16 row moves
16 bytes an access too: two float32 loads (x, w, dy) beside one bf16 load or store. Where a
row is at most 3 strips of 256 columns (the `gpu` preset's 768), a lane holds its columns in
registers between the row's passes instead of reading them again (and the backward its dw
terms across rows), with every sum in the same order: the same bits. On the H200 at
(16384, 768): forward 0.023 ms against float32's 0.034, backward 0.048 against 0.079
(bench/labs/bf16_memory_kernels_gpu.py, bench/labs/rmsnorm_bf16_backward_gpu.py; the
held rows' kernels are in rmsnorm_rows.py).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu import rmsnorm_rows
from euler.gpu.bf16 import stored, widen
from euler.gpu.reduce import MAX_THREADS, WARP, sum_warp_rows, warp_sum_all
from euler.gpu.vector import (
    aligned4,
    aligned8_bf16,
    check_dtypes,
    load4,
    load8_bf16,
    store4,
    store8_bf16,
)
from euler.layer_math import (
    rms_rstd,
    rmsnorm_backward_coefficient,
    rmsnorm_backward_element,
    rmsnorm_forward_element,
)
from euler.precision import BF16, is_bf16

WARPS = 8  # rows in flight per block
# backward blocks: 2 per H200 multiprocessor, 16 rows in flight on each, whose dy and x rows
# (96 KB) the second pass then finds in L1: 0.085 ms a call at (16384, 768) against 0.098
# with 4 a multiprocessor, 0.091 with 6, 0.099 with 8
# (bench/labs/rmsnorm_gpu.py)
PARTIAL_BLOCKS = 264
SUM_WARPS = 8  # warps adding the partials of one 32-column strip


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


@cuda.jit
def rmsnorm_forward_vec_bf16_kernel(y, rstd, x, w, eps, D):
    """rmsnorm_forward_vec_kernel with y bf16, on flat views y, x (N D,): 8 columns a lane
    and step (D % 8 == 0), x and w in two 16-byte loads each, y in one 16-byte store."""
    N = x.shape[0] // D
    T = x.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    lane = cuda.threadIdx.x % WARP
    warps = cuda.gridDim.x * (cuda.blockDim.x // WARP)
    n0 = cuda.blockIdx.x * (cuda.blockDim.x // WARP) + cuda.threadIdx.x // WARP
    for n in range(n0, n0 + (N + warps - 1) // warps * warps, warps):
        s = T(0.0)
        if n < N:
            for d in range(8 * lane, D, 8 * WARP):
                x0, x1, x2, x3 = load4(x, n * D + d)
                x4, x5, x6, x7 = load4(x, n * D + d + 4)
                s += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
                s += x4 * x4 + x5 * x5 + x6 * x6 + x7 * x7
        s = warp_sum_all(s, buf, T(0.0))
        if n < N:
            r = rms_rstd(s, D, eps, T)
            for d in range(8 * lane, D, 8 * WARP):
                x0, x1, x2, x3 = load4(x, n * D + d)
                x4, x5, x6, x7 = load4(x, n * D + d + 4)
                w0, w1, w2, w3 = load4(w, d)
                w4, w5, w6, w7 = load4(w, d + 4)
                store8_bf16(
                    y, n * D + d,
                    rmsnorm_forward_element(x0, r, w0), rmsnorm_forward_element(x1, r, w1),
                    rmsnorm_forward_element(x2, r, w2), rmsnorm_forward_element(x3, r, w3),
                    rmsnorm_forward_element(x4, r, w4), rmsnorm_forward_element(x5, r, w5),
                    rmsnorm_forward_element(x6, r, w6), rmsnorm_forward_element(x7, r, w7),
                )  # fmt: skip
            if lane == 0:
                rstd[n] = r


def rmsnorm_forward(y, rstd, x, w, eps, stream=0, threads: int = 0, held_rows: bool = True) -> None:
    """y (N, D) = x (N, D) / rms(x) * w (D,), assigned; rstd (N,) saved for the backward.

    y float32 or bf16; x, w, rstd float32. held_rows: bf16 rows that fit are held in
    registers (rmsnorm_rows.py), else read twice; the same bits either way."""
    N, D = x.shape
    check_shapes("rmsnorm_forward", y=(y, (N, D)), rstd=(rstd, (N,)), w=(w, (D,)))
    warps = block_warps(threads)
    grid = max(1, min((N + warps - 1) // warps, 65535))
    eps = x.dtype.type(eps)
    if is_bf16(y):
        check_dtypes("rmsnorm_forward", np.float32, rstd=rstd, x=x, w=w)
        if D % 8 == 0 and aligned8_bf16(y) and aligned4(x, w):
            flat = y.reshape(y.size), rstd, x.reshape(x.size), w
            kernel = rmsnorm_forward_vec_bf16_kernel
            if held_rows and rmsnorm_rows.held_in_registers(D):
                kernel = rmsnorm_rows.forward_kernel(D)
            kernel[grid, warps * WARP, stream](*flat, eps, D)
        else:
            rmsnorm_forward_kernel[grid, warps * WARP, stream](y, rstd, x, w, eps)
        return
    if D % 4 == 0 and aligned4(y, x, w):
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
def rmsnorm_backward_vec_bf16_kernel(dx, partial, dy, dres, x, w, rstd, D):
    """rmsnorm_backward_vec_kernel with dres and dx bf16 (dx may alias dres), on flat views
    dx, dy, dres, x (N D,): 8 columns a lane and step (D % 8 == 0), dy, w and x in two
    16-byte loads each, dres in one 16-byte load and dx in one 16-byte store."""
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
            for d in range(8 * lane, D, 8 * WARP):
                for h in range(0, 8, 4):  # two 16-byte float32 pieces, unrolled by NVVM
                    g0, g1, g2, g3 = load4(dy, n * D + d + h)
                    w0, w1, w2, w3 = load4(w, d + h)
                    x0, x1, x2, x3 = load4(x, n * D + d + h)
                    dot += g0 * w0 * x0 + g1 * w1 * x1 + g2 * w2 * x2 + g3 * w3 * x3
        dot = warp_sum_all(dot, buf, T(0.0))
        if n < r1:
            r = rstd[n]
            k = rmsnorm_backward_coefficient(dot, r, D, T)
            for d in range(8 * lane, D, 8 * WARP):
                e0, e1, e2, e3, e4, e5, e6, e7 = load8_bf16(dres, n * D + d)
                g0, g1, g2, g3 = load4(dy, n * D + d)
                w0, w1, w2, w3 = load4(w, d)
                x0, x1, x2, x3 = load4(x, n * D + d)
                e0, a0 = rmsnorm_backward_element(g0, x0, w0, e0, r, k)
                e1, a1 = rmsnorm_backward_element(g1, x1, w1, e1, r, k)
                e2, a2 = rmsnorm_backward_element(g2, x2, w2, e2, r, k)
                e3, a3 = rmsnorm_backward_element(g3, x3, w3, e3, r, k)
                g0, g1, g2, g3 = load4(dy, n * D + d + 4)
                w0, w1, w2, w3 = load4(w, d + 4)
                x0, x1, x2, x3 = load4(x, n * D + d + 4)
                e4, a4 = rmsnorm_backward_element(g0, x0, w0, e4, r, k)
                e5, a5 = rmsnorm_backward_element(g1, x1, w1, e5, r, k)
                e6, a6 = rmsnorm_backward_element(g2, x2, w2, e6, r, k)
                e7, a7 = rmsnorm_backward_element(g3, x3, w3, e7, r, k)
                a = q * D + d
                acc[a] += a0
                acc[a + 1] += a1
                acc[a + 2] += a2
                acc[a + 3] += a3
                acc[a + 4] += a4
                acc[a + 5] += a5
                acc[a + 6] += a6
                acc[a + 7] += a7
                store8_bf16(dx, n * D + d, e0, e1, e2, e3, e4, e5, e6, e7)
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


def partial_rows(N: int) -> int:
    """Row chunks (C) of the backward: one block each."""
    return max(1, min(N, PARTIAL_BLOCKS))


def rmsnorm_backward(
    dx, dw, dy, dres, x, w, rstd, accumulate, partial, stream=0, threads: int = 0,
    held_rows: bool = True,
) -> None:  # fmt: skip
    """dx (N, D) = dres + J^T dy, assigned; dw (D,) (+)= sum_n dy x rstd (+= if accumulate).

    dx may alias dres. partial is (C, D) scratch with C = partial_rows(N) (or fewer rows).
    dx and dres both float32 or both bf16; dy, x, w, rstd, dw and partial float32.
    held_rows as rmsnorm_forward's.
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
    if is_bf16(dx):
        check_dtypes("rmsnorm_backward", BF16, dres=dres)
        check_dtypes("rmsnorm_backward", np.float32, dw=dw, dy=dy, x=x, w=w, rstd=rstd,
                     partial=partial)  # fmt: skip
        if D % 8 == 0 and aligned8_bf16(dx, dres) and aligned4(dy, x, w):
            flat = [a.reshape(a.size) for a in (dx, dy, dres, x)]
            kernel = rmsnorm_backward_vec_bf16_kernel
            if held_rows and rmsnorm_rows.held_in_registers(D):
                kernel = rmsnorm_rows.backward_kernel(D)
            kernel[C, warps * WARP, stream, nbytes](
                flat[0], partial, flat[1], flat[2], flat[3], w, rstd, D
            )
        else:
            rmsnorm_backward_kernel[C, warps * WARP, stream, nbytes](
                dx, partial, dy, dres, x, w, rstd
            )
    elif D % 4 == 0 and aligned4(dx, dy, dres, x, w):
        flat = [a.reshape(a.size) for a in (dx, dy, dres, x)]
        rmsnorm_backward_vec_kernel[C, warps * WARP, stream, nbytes](
            flat[0], partial, flat[1], flat[2], flat[3], w, rstd, D
        )
    else:
        rmsnorm_backward_kernel[C, warps * WARP, stream, nbytes](dx, partial, dy, dres, x, w, rstd)
    sw = min(SUM_WARPS, warps)
    grid = (D + WARP - 1) // WARP
    sum_partials_kernel[grid, sw * WARP, stream](dw, partial, np.bool_(accumulate))
