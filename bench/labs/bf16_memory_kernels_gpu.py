"""RMSNorm, SwiGLU, the embedding backward and the transpose in float32 and bf16 on a GPU.

    python bench/labs/bf16_memory_kernels_gpu.py [--reps 5] [--swiglu-threads 128,256]
        [--out bf16_memory.json]

Each kernel at the `gpu` preset's shapes (N = B T = 32 x 512 tokens, D = 768, F = 2048,
V = 4096), once with every tensor float32 and once with the dtypes of --precision bf16
(euler.precision.BF16_TENSORS): device ms a call (bench/gpu_timing.timed, launch-free), the
bytes the call must move, and what that is per second. The transposes' results are checked
against NumPy bit for bit; the layers' numerics are tests/test_gpu_bf16.py's. SwiGLU's
bf16 kernels run again at each block size of --swiglu-threads (swiglu.BF16_THREADS, up to
the launchers' default of memory.THREADS).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda, uint32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import embedding, rmsnorm, swiglu, transpose  # noqa: E402
from euler.gpu.backend import multiprocessors  # noqa: E402
from euler.gpu.memory import THREADS  # noqa: E402
from euler.gpu.transpose import PADDED, SIDE, TILE  # noqa: E402
from euler.gpu.vector import aligned8_bf16, load4_u32, store4_u32  # noqa: E402
from euler.precision import is_bf16, to_bf16  # noqa: E402

N, D, F, V = 32 * 512, 768, 2048, 4096

# ---------------------------------------------------------------- the bf16 transpose
# The package transposes float32 weight-gradient operands only: bf16 products gained
# nothing from it (GpuOptions). Its bf16 variant stays here, measured: bf16 bits move
# through a tile of uint32, one element a slot; a 16-byte piece is 8 elements, 8 threads a
# tile row, a warp four whole 128-byte rows at a time, shared-memory accesses 2-way
# conflicted at most (0.0146 ms for a 768-wide operand of 16384 rows on the H200, 3.4 TB/s).


@cuda.jit(device=True, inline=True)
def _split(tile, r, c, w):
    """tile[r, c], tile[r, c + 1] = the low and high uint16 halves of word w."""
    tile[r, c] = w & np.uint32(0xFFFF)
    tile[r, c + 1] = w >> np.uint32(16)


@cuda.jit(device=True, inline=True)
def _join(tile, r, c):
    """The word of tile[r, c] (low half) and tile[r + 1, c] (high half)."""
    return tile[r, c] | (tile[r + 1, c] << np.uint32(16))


@cuda.jit
def transpose_bf16_kernel(dst, src, R, C, vec):
    """euler.gpu.transpose's kernel for bf16 bits: dst (C R,) = src (R C,)^T, flat uint16
    arrays; vec: rows of both hold whole 16-byte pieces (aligned, R and C multiples of 8)."""
    tile = cuda.shared.array((TILE, PADDED), uint32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if vec and r0 + TILE <= R and c0 + TILE <= C:
        # thread: piece p (columns 8p ..) of tile rows k, k + 32; a warp covers 4 whole rows
        p, k = tx % 8, 2 * ty + tx // 8
        for j in range(0, TILE, TILE // 2):
            w0, w1, w2, w3 = load4_u32(src, (r0 + k + j) * C + c0 + 8 * p)
            _split(tile, k + j, 8 * p, w0)
            _split(tile, k + j, 8 * p + 2, w1)
            _split(tile, k + j, 8 * p + 4, w2)
            _split(tile, k + j, 8 * p + 6, w3)
        cuda.syncthreads()
        for j in range(0, TILE, TILE // 2):  # dst row c0 + k + j holds src column k + j
            t, a = k + j, 8 * p
            store4_u32(dst, (c0 + t) * R + r0 + a, _join(tile, a, t), _join(tile, a + 2, t),
                       _join(tile, a + 4, t), _join(tile, a + 6, t))  # fmt: skip
        return
    for j in range(0, TILE, SIDE):  # an edge tile: each thread 16 elements, SIDE apart
        for i in range(0, TILE, SIDE):
            r, c = r0 + ty + j, c0 + tx + i
            if r < R and c < C:
                tile[ty + j, tx + i] = src[r * C + c]
    cuda.syncthreads()
    for j in range(0, TILE, SIDE):
        for i in range(0, TILE, SIDE):
            r, c = c0 + ty + j, r0 + tx + i
            if r < C and c < R:
                dst[r * R + c] = np.uint16(tile[tx + i, ty + j])


def transpose_any(dst, src, stream) -> None:
    """dst (C, R) = src (R, C)^T: the package's for float32, transpose_bf16_kernel for bf16."""
    if not is_bf16(src):
        transpose.transpose(dst, src, stream)
        return
    R, C = src.shape
    grid = ((C + TILE - 1) // TILE, (R + TILE - 1) // TILE)
    vec = aligned8_bf16(dst, src) and R % 8 == 0 and C % 8 == 0
    transpose_bf16_kernel[grid, (SIDE, SIDE), stream](dst.reshape(dst.size),
                                                      src.reshape(src.size), R, C, vec)  # fmt: skip


def cases(stream, bf16: bool):
    """(name, bytes moved, call) of each kernel with float32 or the bf16 run's dtypes."""
    rng = np.random.default_rng(0)
    lp = np.uint16 if bf16 else np.float32  # the tensors BF16_TENSORS makes bf16

    def dev(shape, dtype=np.float32):
        x = rng.standard_normal(shape).astype(np.float32)
        return cuda.to_device(to_bf16(x) if dtype == np.uint16 else x, stream=stream)

    size = {np.float32: 4, np.uint16: 2}
    x, w, rstd, dy, dw = dev((N, D)), dev(D), dev(N), dev((N, D)), dev(D)
    y, dx = dev((N, D), lp), dev((N, D), lp)
    partial = dev((rmsnorm.partial_rows(N, rmsnorm.PARTIAL_BLOCKS_PER_SM * multiprocessors()), D))
    gu, h, dh, dgu = dev((N, 2 * F), lp), dev((N, F), lp), dev((N, F), lp), dev((N, 2 * F), lp)
    tokens = cuda.to_device(rng.integers(0, V, N).astype(np.int32), stream=stream)
    dwte = dev((V, D))
    src, dst = dev((N, D), lp), dev((D, N), lp)
    s = size[lp]
    yield ("rmsnorm_forward", N * D * (4 + s),
           lambda: rmsnorm.rmsnorm_forward(y, rstd, x, w, 1e-5, stream))  # fmt: skip

    def norm_backward():  # dx aliasing dres, as the model calls it
        rmsnorm.rmsnorm_backward(dx, dw, dy, dx, x, w, rstd, True, partial, stream)

    yield "rmsnorm_backward", N * D * (4 + 4 + 2 * s), norm_backward  # dy, x, dres, dx
    yield ("swiglu_forward", N * F * 3 * s, lambda: swiglu.swiglu_forward(h, gu, stream))
    yield ("swiglu_backward", N * F * 5 * s, lambda: swiglu.swiglu_backward(dgu, dh, gu, stream))
    yield ("embedding_backward", N * D * s,
           lambda: embedding.embedding_backward(dwte, dx, tokens, True, stream))  # fmt: skip
    host = src.copy_to_host(stream=stream)
    transpose_any(dst, src, stream)
    assert np.array_equal(dst.copy_to_host(stream=stream), host.T), "transpose"
    yield ("transpose", 2 * N * D * s, lambda: transpose_any(dst, src, stream))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--swiglu-threads", default="128,256")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream, rows = cuda.stream(), []
    runs = [("fp32", None)] + [("bf16", None)]
    runs += [("bf16", int(t)) for t in args.swiglu_threads.split(",") if t]
    package_threads = swiglu.BF16_THREADS
    for precision, threads in runs:
        swiglu.BF16_THREADS = threads or package_threads
        for name, nbytes, call in cases(stream, precision == "bf16"):
            if threads and not name.startswith("swiglu"):
                continue
            ms = timed(stream, call, args.reps)
            rec = {"kernel": name, "precision": precision, "N": N, "D": D, "F": F, "ms": ms,
                   "mbytes": nbytes / 1e6, "tb_per_s": nbytes / ms / 1e9}  # fmt: skip
            if name.startswith("swiglu") and precision == "bf16":
                rec["block"] = min(swiglu.BF16_THREADS, THREADS)
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
