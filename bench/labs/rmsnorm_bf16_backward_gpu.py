"""The bf16 RMSNorm with rows held in registers (the package at D = 768) against re-reading them.

    python bench/labs/rmsnorm_bf16_backward_gpu.py [--shapes 264x8,528x4,528x8,1056x4]
        [--reps 5] [--out rmsnorm_bf16_backward.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/rmsnorm_bf16_backward_gpu.py --n 24 \
        --shapes 264x8,4x2 --check-only

This lab's 16-byte bf16 kernels (rmsnorm_forward_vec_bf16_kernel,
rmsnorm_backward_vec_bf16_kernel, once the package's) read a row twice, finding it in L1 the
second time; the backward adds each row's dw terms into its warp's row of shared memory.
euler/gpu/rmsnorm.py's bf16 kernels, where a row is at most 3 strips of 256 columns, keep
a lane's 8 S columns of the row (dy, x and the dres words in the backward) in registers
between the passes, and its dw terms across rows (elsewhere the package takes its generic
kernel). Every sum is taken in the same
order, so y, rstd, dx and dw must be the same bits: the lab checks it before timing (dw at
the package's blocks x 8 only: other block shapes cut the rows otherwise).

Each backward is timed with its dw partial sum (sum_partials_kernel) at B = 32, T = 512,
D = 768, dx aliasing dres as the model calls it, launch-free (bench/gpu_timing.timed);
shapes are blocks x warps a block (the package: two blocks a multiprocessor x 8).
The figures are in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numba
import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import rmsnorm  # noqa: E402
from euler.gpu.backend import multiprocessors  # noqa: E402
from euler.gpu.reduce import MAX_THREADS, WARP, sum_warp_rows, warp_sum_all  # noqa: E402
from euler.gpu.rmsnorm import sum_partials_kernel  # noqa: E402
from euler.gpu.vector import load4, load8_bf16, store8_bf16  # noqa: E402
from euler.layer_math import (  # noqa: E402
    rms_rstd,
    rmsnorm_backward_coefficient,
    rmsnorm_backward_element,
    rmsnorm_forward_element,
)
from euler.precision import to_bf16  # noqa: E402

N, D = 32 * 512, 768


@cuda.jit
def rmsnorm_forward_vec_bf16_kernel(y, rstd, x, w, eps, D):
    """rmsnorm.rmsnorm_forward_vec_kernel with y bf16, on flat views y, x (N D,): 8 columns a lane
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


@cuda.jit
def rmsnorm_backward_vec_bf16_kernel(dx, partial, dy, dres, x, w, rstd, D):
    """rmsnorm.rmsnorm_backward_vec_kernel with dres and dx bf16 (dx may alias dres), on flat views
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
    rmsnorm._zero_warp_row(acc, q, D, lane, T)
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


def backward_with(kernel, dx, dw, dy, dres, x, w, rstd, partial, warps, stream) -> None:
    """rmsnorm.rmsnorm_backward's bf16 call through `kernel`: partial (C, D), C blocks of
    `warps` warps."""
    n, d = x.shape
    C = partial.shape[0]
    flat = [a.reshape(a.size) for a in (dx, dy, dres, x)]
    kernel[C, warps * WARP, stream, warps * d * 4](
        flat[0], partial, flat[1], flat[2], flat[3], w, rstd, d
    )
    grid = (d + WARP - 1) // WARP
    sum_partials_kernel[grid, min(rmsnorm.SUM_WARPS, warps) * WARP, stream](
        dw, partial, np.bool_(False)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="264x8,528x4,528x8,396x8,1056x4")  # H200: 132 SMs
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
    blocks = rmsnorm.PARTIAL_BLOCKS_PER_SM * multiprocessors()
    partial = dev(np.zeros((rmsnorm.partial_rows(n, blocks), D), np.float32))

    def reread():  # dx aliasing dres, as the model calls it
        backward_with(rmsnorm_backward_vec_bf16_kernel, dx, dw, dy, dx, x, w, rstd,
                      partial, rmsnorm.WARPS, stream)  # fmt: skip

    def result(call):
        dx.copy_to_device(dres, stream=stream)
        call()
        return dx.copy_to_host(stream=stream), dw.copy_to_host(stream=stream)

    want = result(reread)
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
        rmsnorm_forward_vec_bf16_kernel[grid, rmsnorm.WARPS * WARP, stream](
            y.reshape(y.size), ry, x.reshape(x.size), w, eps, D
        )

    def forward_rows():
        rmsnorm.rmsnorm_forward(y2, ry2, x, w, 1e-5, stream)

    for name, call in (("forward re-read", forward), ("forward rows (package)", forward_rows)):
        call()
        ms = clock(call)
        rec = {"variant": name, "N": n, "D": D, "ms": ms, "mbytes": fwd_bytes / 1e6,
               "tb_per_s": ms and fwd_bytes / ms / 1e9}  # fmt: skip
        if name.startswith("forward rows"):
            same = np.array_equal(y.copy_to_host(), y2.copy_to_host())
            rec["identical"] = bool(same and np.array_equal(ry.copy_to_host(), ry2.copy_to_host()))
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    record(variant="re-read", blocks=partial.shape[0], warps=rmsnorm.WARPS,
           ms=clock(reread))  # fmt: skip
    for shape in args.shapes.split(","):
        blocks, warps = (int(v) for v in shape.split("x"))
        part = dev(np.zeros((min(n, blocks), D), np.float32))

        kern = rmsnorm.backward_kernel(D)

        def call(part=part, warps=warps, kern=kern):
            backward_with(kern, dx, dw, dy, dx, x, w, rstd, part, warps, stream)

        got = result(call)
        regs = {}
        if not numba.config.ENABLE_CUDASIM and kern.overloads:  # spills show as local memory
            compiled = next(iter(kern.overloads.values()))
            regs = {"registers": getattr(compiled, "regs_per_thread", None),
                    "local_bytes": getattr(compiled, "local_mem_per_thread", None)}  # fmt: skip
        same_dx = bool(np.array_equal(got[0], want[0]))
        dw_err = float(np.max(np.abs(got[1] - want[1])))  # the dw order holds at 264 x 8 only
        name = "rows (package)" if (blocks, warps) == (partial.shape[0], rmsnorm.WARPS) else "rows"
        record(variant=name, blocks=blocks, warps=warps, dx_identical=same_dx,
               dw_max_abs_diff=dw_err, **regs, ms=clock(call))  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
