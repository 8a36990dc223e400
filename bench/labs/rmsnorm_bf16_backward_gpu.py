"""The bf16 RMSNorm backward and forward with each row held in registers, against the package.

    python bench/labs/rmsnorm_bf16_backward_gpu.py [--shapes 264x8,528x4,528x8,1056x4]
        [--reps 5] [--out rmsnorm_bf16_backward.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/rmsnorm_bf16_backward_gpu.py --n 24 \
        --shapes 264x8,4x2 --check-only

The package's kernel (euler.gpu.rmsnorm.rmsnorm_backward_vec_bf16_kernel) reads a row's dy and
x twice, once for the row's dot and once for dx, finding them in L1 the second time, and
adds each row's dw terms into its warp's row of shared memory. At the `gpu` preset's
(16384, 768) it moves 151 MB in 0.069 ms on an H200, 2.2 TB/s, where the forward reaches
3.0. The variant here (`rows`) is compiled for D = 256 S (S a constant of the kernel: 3 at
D = 768), so that each lane keeps its 8 S columns of the row, dy, x and the dres words,
in registers between the two passes, and its dw terms in registers across rows, writing
them to shared memory once at the end. Every sum is taken in the package's order, so dx
and dw must be bit for bit the package's: the lab checks it before timing.

Each variant is timed with its dw partial sum (sum_partials_kernel) at B = 32, T = 512,
D = 768, dx aliasing dres as the model calls it, launch-free (bench/gpu_timing.timed);
shapes are blocks x warps a block (the package: 264 x 8, two blocks a multiprocessor).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
from numba import cuda, float32, uint32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import rmsnorm  # noqa: E402
from euler.gpu.reduce import MAX_THREADS, SIMULATOR, WARP, warp_sum_all  # noqa: E402
from euler.gpu.rmsnorm import _sum_warp_rows, sum_partials_kernel  # noqa: E402
from euler.gpu.vector import (  # noqa: E402
    load4,
    load4_u32,
    store8_bf16,
    widen_high,
    widen_low,
)
from euler.layer_math import (  # noqa: E402
    rms_rstd,
    rmsnorm_backward_coefficient,
    rmsnorm_backward_element,
    rmsnorm_forward_element,
)
from euler.precision import to_bf16  # noqa: E402

N, D = 32 * 512, 768
STRIP = 8 * WARP  # columns a warp covers in one step: 8 a lane


@cache
def rows_kernel(S: int):
    """The backward for D = STRIP S: dx (N D,) bf16 = dres + J^T dy; partial (C, D) = block
    c's rows' dw terms, summed in the package's order. One warp a row, its lane's 8 S
    columns of dy, x and dres kept in registers between the row's two passes."""
    C8, C4 = 8 * S, 4 * S

    @cuda.jit
    def kernel(dx, partial, dy, dres, x, w, rstd, D):
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
        _sum_warp_rows(partial, sacc, c, W, D, float32)

    return kernel


@cache
def rows_forward_kernel(S: int):
    """The bf16 forward for D = STRIP S: y (N D,) bf16 = x / rms(x) * w, rstd (N,); one warp
    a row, its lane's 8 S columns of x kept in registers between the sum and the store."""
    C8 = 8 * S

    @cuda.jit
    def kernel(y, rstd, x, w, eps, D):
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

    return kernel


def rows_backward(dx, dw, dy, dres, x, w, rstd, accumulate, partial, warps, stream) -> None:
    """rmsnorm.rmsnorm_backward's bf16 call through rows_kernel: partial (C, D), C blocks of
    `warps` warps; D a multiple of STRIP."""
    n, d = x.shape
    C = partial.shape[0]
    flat = [a.reshape(a.size) for a in (dx, dy, dres, x)]
    rows_kernel(d // STRIP)[C, warps * WARP, stream, warps * d * 4](
        flat[0], partial, flat[1], flat[2], flat[3], w, rstd, d
    )
    grid = (d + WARP - 1) // WARP
    sum_partials_kernel[grid, min(rmsnorm.SUM_WARPS, warps) * WARP, stream](
        dw, partial, np.bool_(accumulate)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="264x8,528x4,528x8,396x8,1056x4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=N, help="rows (the simulator: a few hundred)")
    ap.add_argument("--check-only", action="store_true", help="compare, do not time")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    n = args.n

    def clock(call):
        return None if args.check_only else timed(stream, call, args.reps)

    stream, rows = cuda.stream(), []
    rng = np.random.default_rng(0)

    def dev(a):
        return cuda.to_device(a, stream=stream)

    x, dy = (dev(rng.standard_normal((n, D)).astype(np.float32)) for _ in range(2))
    w = dev(rng.standard_normal(D).astype(np.float32))
    rstd = dev((1 + rng.random(n)).astype(np.float32))
    dres = to_bf16(rng.standard_normal((n, D)).astype(np.float32))
    dx, dw = dev(dres), dev(np.zeros(D, np.float32))
    partial = dev(np.zeros((rmsnorm.partial_rows(n), D), np.float32))

    def package():  # dx aliasing dres, as the model calls it
        rmsnorm.rmsnorm_backward(dx, dw, dy, dx, x, w, rstd, False, partial, stream)

    def result(call):
        dx.copy_to_device(dres, stream=stream)
        call()
        return dx.copy_to_host(stream=stream), dw.copy_to_host(stream=stream)

    want = result(package)
    nbytes = n * D * (4 + 4 + 2 + 2)  # dy, x read; dres read; dx written

    def record(**rec) -> None:
        ms = rec["ms"]
        rec.update(N=n, D=D, mbytes=nbytes / 1e6, tb_per_s=ms and nbytes / ms / 1e9)
        rows.append(rec)
        print(json.dumps(rec), flush=True)

    y, ry = dev(np.zeros((n, D), np.uint16)), dev(np.zeros(n, np.float32))
    y2, ry2 = dev(np.zeros((n, D), np.uint16)), dev(np.zeros(n, np.float32))
    eps = np.float32(1e-5)
    grid = max(1, min((n + rmsnorm.WARPS - 1) // rmsnorm.WARPS, 65535))
    fwd_bytes = n * D * (4 + 2)

    def forward():
        rmsnorm.rmsnorm_forward(y, ry, x, w, 1e-5, stream)

    def forward_rows():
        rows_forward_kernel(D // STRIP)[grid, rmsnorm.WARPS * WARP, stream](
            y2.reshape(y2.size), ry2, x.reshape(x.size), w, eps, D
        )

    for name, call in (("forward package", forward), ("forward rows", forward_rows)):
        call()
        ms = clock(call)
        rec = {"variant": name, "N": n, "D": D, "ms": ms, "mbytes": fwd_bytes / 1e6,
               "tb_per_s": ms and fwd_bytes / ms / 1e9}  # fmt: skip
        if name == "forward rows":
            same = np.array_equal(y.copy_to_host(), y2.copy_to_host())
            rec["identical"] = bool(same and np.array_equal(ry.copy_to_host(), ry2.copy_to_host()))
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    record(variant="package", blocks=partial.shape[0], warps=rmsnorm.WARPS,
           ms=clock(package))  # fmt: skip
    for shape in args.shapes.split(","):
        blocks, warps = (int(v) for v in shape.split("x"))
        part = dev(np.zeros((min(n, blocks), D), np.float32))

        def call(part=part, warps=warps):
            rows_backward(dx, dw, dy, dx, x, w, rstd, False, part, warps, stream)

        got = result(call)
        kern = rows_kernel(D // STRIP)
        regs = {}
        if not SIMULATOR and kern.overloads:  # spills show as local memory
            compiled = next(iter(kern.overloads.values()))
            regs = {"registers": getattr(compiled, "regs_per_thread", None),
                    "local_bytes": getattr(compiled, "local_mem_per_thread", None)}  # fmt: skip
        same_dx = bool(np.array_equal(got[0], want[0]))
        dw_err = float(np.max(np.abs(got[1] - want[1])))  # the dw order holds at 264 x 8 only
        record(variant="rows", blocks=blocks, warps=warps, dx_identical=same_dx,
               dw_max_abs_diff=dw_err, **regs, ms=clock(call))  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
