"""RMSNorm in bf16 with each row held in registers: rmsnorm.py's 16-byte kernels, unrolled.

rmsnorm.py's bf16 kernels read a row twice: the forward its x for the sum and again for
the store, the backward its dy and x for the row's dot and again for dx (from L1 the second
time), adding each row's dw terms into its warp's row of shared memory. The kernels here
are compiled for one row width D = 256 S (S strips of 8 columns a lane), so that a lane
keeps its 8 S columns in registers between the passes, and the backward its dw terms
across rows, written to shared memory once at the end. Every sum is taken in rmsnorm.py's
order, so the results are its bits (bench/labs/rmsnorm_bf16_backward_gpu.py checks it on
the H200; tests/test_gpu_sim.py in the simulator). rmsnorm.py's launchers pick them where
held_in_registers(D): on the H200 at (16384, 768) the backward takes 0.048 ms against
0.068, 3.1 TB/s, the forward 0.023 against 0.026.
"""

from __future__ import annotations

from functools import cache

from numba import cuda, float32, uint32

from euler.gpu.reduce import MAX_THREADS, WARP, sum_warp_rows, warp_sum_all
from euler.gpu.vector import load4, load4_u32, store8_bf16, widen_high, widen_low
from euler.layer_math import (
    rms_rstd,
    rmsnorm_backward_coefficient,
    rmsnorm_backward_element,
    rmsnorm_forward_element,
)

STRIP = 8 * WARP  # columns a warp covers in one step: 8 a lane
MAX_STRIPS = 3  # 128 registers a thread at 3 (D = 768), none spilled


def held_in_registers(D: int) -> bool:
    """Whether rows of D columns take these kernels (D a multiple of STRIP, at most 3)."""
    return D % STRIP == 0 and D // STRIP <= MAX_STRIPS


@cache
def forward_kernel(D: int):
    """rmsnorm.rmsnorm_forward_vec_bf16_kernel for rows of D = STRIP S columns, its sum in
    the same order: one warp a row, its lane's 8 S columns of x held in registers between
    the sum and the store. y, x flat (N D,), y bf16."""
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
    """rmsnorm.rmsnorm_backward_vec_bf16_kernel for rows of D = STRIP S columns, each sum in
    its order (the same bits): one warp a row, its lane's 8 S columns of dy, x and the dres
    words held in registers between the row's two passes, and its dw terms across rows,
    written to shared memory once at the end. dx, dy, dres, x flat (N D,); dx, dres bf16."""
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
