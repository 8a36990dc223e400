"""Weight-gradient GEMMs: can they beat cuBLAS's row-major trans_a=True call? (TF32, H200)

    python3 bench/labs/gemm_lab_gpu.py --out $OUT/gemm-lab.json    [--reps 20] [--tiny]

A layer's weight gradient dW (M=out, N=in) = dY^T X, with dY (K, M) and X (K, N) over
K = 16384 tokens, is `be.matmul(dW, dY, X, trans_a=True)`. On the H200 it ran at 121-191
TFLOP/s, while the forward products (trans_b=True) ran at 243-333 and the measured TF32
peak is 411-427. Hypothesis: Hopper's TF32 tensor-core kernels want both operands K-major
(K contiguous). This call is cuBLAS's column-major "NT", where neither operand is. Small
outputs also under-fill the GPU (768 x 768 is 36 tiles of 128 x 128 for 132 SMs).

For each dW shape (M, N, K), one JSON line per record (median ms of --reps runs, from CUDA
events after a warm-up; TFLOP/s = 2 M N K / time):
- baseline: the call as training makes it;
- transpose: the package's transpose (euler/gpu/transpose.py) of dY into dYT (M, K) and of
  X into XT (N, K): ms, GB/s (read + write), and whether the result is exact;
- pretransposed: the token-contiguous "TN" product be.matmul(dW, dYT, XT, trans_b=True),
  checked against baseline (TF32: relative error < 1e-2);
- one_sided: only XT (cuBLAS's TT) or only dYT (its NN) token-contiguous, checked;
- pretransposed_plus_transposes: both transposes then that product, timed as one chain
  (and the sum of the separately timed parts);
- split_k S (S = 2, 4, 8): K cut into S slices, a batched GEMM into S partials (S, M, N),
  then a kernel that sums them into dW. Records the total and the GEMM alone, checked;
- two_streams: the layer's dX (K, N) = dY W (W is (M, N)) and its dW. Times them one after
  the other on one stream, and concurrently, with dW on a second stream and its own cuBLAS
  handle, forked and joined with events.
An exception becomes a {"kind": "error"} record and the run goes on. --out is rewritten
after every record. --tiny runs small odd shapes, to check the code paths quickly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_gpu import timed  # noqa: E402
from bench.records import emit, guarded, rel_err  # noqa: E402
from euler.gpu.backend import CUBLAS_WORKSPACE, GpuBackend  # noqa: E402
from euler.gpu.cublas import Cublas  # noqa: E402
from euler.gpu.transpose import transpose  # noqa: E402

SHAPES = [(4096, 768, 16384), (768, 2048, 16384), (1280, 768, 16384), (768, 768, 16384)]
TINY = [(200, 72, 1000), (96, 160, 512)]  # tails in every tile; K divisible by 8
SPLITS = (2, 4, 8)
SUM_THREADS = 256


@cuda.jit
def sum_partials_kernel(out, partial):
    """out[i] = sum over s of partial[s, i]: one thread per element, grid-stride."""
    S, n = partial.shape
    i = cuda.grid(1)
    while i < n:
        acc = float32(0.0)
        for s in range(S):
            acc += partial[s, i]
        out[i] = acc
        i += cuda.gridsize(1)


def sum_partials(stream, out, partial) -> None:
    """Launch sum_partials_kernel: out (M, N) = partial (S, M, N) summed over S, on stream."""
    S, M, N = partial.shape
    blocks = min((M * N + SUM_THREADS - 1) // SUM_THREADS, 8192)
    sum_partials_kernel[blocks, SUM_THREADS, stream](out.reshape(M * N), partial.reshape(S, M * N))


def tflops(M: int, N: int, K: int, ms: float, products: int = 1) -> float:
    return round(2 * M * N * K * products / ms / 1e9, 1)


def bench_shape(be: GpuBackend, path: Path | None, M: int, N: int, K: int, reps: int) -> None:
    """Every record of one dW shape (M, N, K)."""
    rng = np.random.default_rng(0)
    rand = lambda *s: be.to_device(rng.standard_normal(s, dtype=np.float32))
    dY, X, W = rand(K, M), rand(K, N), rand(M, N)
    dW, dYT, XT = (be.zeros(s, np.float32) for s in ((M, N), (M, K), (N, K)))
    shape = {"M": M, "N": N, "K": K}
    ms_of = lambda fn: round(timed(be, fn, reps), 4)

    def checked(kind: str, out, ms: float, **extra) -> None:
        err = rel_err(be.to_host(out), ref)
        ok = None if err is None else err < 1e-2
        emit(path, kind=kind, **shape, **extra, ms=ms, tflops=tflops(M, N, K, ms),
             rel_err=err, ok=ok)  # fmt: skip

    def baseline() -> np.ndarray:
        ms = ms_of(lambda: be.matmul(dW, dY, X, trans_a=True))
        emit(path, kind="baseline", **shape, ms=ms, tflops=tflops(M, N, K, ms))
        return be.to_host(dW)

    ref = guarded(path, "baseline", baseline, **shape)

    def transpose_one(name: str, dst, src) -> float:
        transpose(dst, src, be.stream)
        exact = bool(np.array_equal(be.to_host(dst), be.to_host(src).T))
        ms = ms_of(lambda: transpose(dst, src, be.stream))
        emit(path, kind="transpose", **shape, operand=name, rows=src.shape[0],
             cols=src.shape[1], ms=ms, gb_s=round(2 * src.size * 4 / ms / 1e6, 1),
             exact=exact)  # fmt: skip
        return ms

    t_dy = guarded(path, "transpose dY", lambda: transpose_one("dY", dYT, dY), **shape)
    t_x = guarded(path, "transpose X", lambda: transpose_one("X", XT, X), **shape)

    def pretransposed() -> float:
        out = be.zeros((M, N), np.float32)
        ms = ms_of(lambda: be.matmul(out, dYT, XT, trans_b=True))
        checked("pretransposed", out, ms)
        return ms

    pre = guarded(path, "pretransposed", pretransposed, **shape)

    def one_sided(which: str) -> None:
        """Only one operand token-contiguous: X (cuBLAS's TT) or dY (its NN)."""
        out = be.zeros((M, N), np.float32)
        if which == "X":
            fn = lambda: be.matmul(out, dY, XT, trans_a=True, trans_b=True)
        else:
            fn = lambda: be.matmul(out, dYT, X)
        checked("one_sided", out, ms_of(fn), pretransposed=which)

    for which in ("X", "dY"):
        guarded(path, f"one_sided {which}", lambda w=which: one_sided(w), **shape)

    def chain() -> None:
        out = be.zeros((M, N), np.float32)

        def fn() -> None:
            transpose(dYT, dY, be.stream)
            transpose(XT, X, be.stream)
            be.matmul(out, dYT, XT, trans_b=True)

        parts = None if None in (t_dy, t_x, pre) else t_dy + t_x + pre
        checked("pretransposed_plus_transposes", out, ms_of(fn), sum_of_parts_ms=parts)

    guarded(path, "pretransposed_plus_transposes", chain, **shape)

    def split_k(S: int) -> None:
        if K % S:
            raise ValueError(f"K={K} is not a multiple of S={S}")
        partial, out = be.zeros((S, M, N), np.float32), be.zeros((M, N), np.float32)
        dYs, Xs = dY.reshape(S, K // S, M), X.reshape(S, K // S, N)
        gemm = lambda: be.matmul_batched(partial, dYs, Xs, trans_a=True)

        def fn() -> None:
            gemm()
            sum_partials(be.stream, out, partial)

        checked("split_k", out, ms_of(fn), S=S, gemm_ms=ms_of(gemm))

    for S in SPLITS:
        guarded(path, f"split_k {S}", lambda S=S: split_k(S), **shape)

    def two_streams() -> None:
        dX, dW2 = be.zeros((K, N), np.float32), be.zeros((M, N), np.float32)
        stream2 = cuda.stream()
        handle = stream2.handle
        blas2 = Cublas(int(getattr(handle, "value", handle)), tf32=be.blas.tf32)
        try:
            workspace = cuda.device_array(CUBLAS_WORKSPACE, np.uint8)
            blas2.set_workspace(workspace)
            be.synchronize()
            fork, join = cuda.event(timing=False), cuda.event(timing=False)

            def serial() -> None:
                be.matmul(dX, dY, W)
                be.matmul(dW, dY, X, trans_a=True)

            def concurrent() -> None:
                fork.record(be.stream)
                fork.wait(stream2)  # stream2 starts after what be.stream queued before
                blas2.gemm(dW2, dY, X, trans_a=True)
                be.matmul(dX, dY, W)
                join.record(stream2)
                join.wait(be.stream)  # be.stream's stop event waits for stream2's dW

            dx_ms, serial_ms = ms_of(lambda: be.matmul(dX, dY, W)), ms_of(serial)
            conc_ms = ms_of(concurrent)
            err = rel_err(be.to_host(dW2), ref)
            emit(path, kind="two_streams", **shape, dx_ms=dx_ms, serial_ms=serial_ms,
                 concurrent_ms=conc_ms, speedup=round(serial_ms / conc_ms, 3),
                 serial_tflops=tflops(M, N, K, serial_ms, 2),
                 concurrent_tflops=tflops(M, N, K, conc_ms, 2), dw_rel_err=err,
                 ok=None if err is None else err < 1e-2)  # fmt: skip
        finally:
            stream2.synchronize()
            blas2.close()

    guarded(path, "two_streams", two_streams, **shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="timed runs per measurement")
    ap.add_argument("--out", type=Path, default=None, help="JSON list of every record")
    ap.add_argument("--tiny", action="store_true", help="small odd shapes, a quick check")
    args = ap.parse_args()
    be = GpuBackend(tf32=True)
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    emit(args.out, kind="device", name=name, cc=list(dev.compute_capability),
         sms=dev.MULTIPROCESSOR_COUNT, tf32=be.blas.tf32, reps=args.reps)  # fmt: skip
    for M, N, K in TINY if args.tiny else SHAPES:
        run = lambda M=M, N=N, K=K: bench_shape(be, args.out, M, N, K, args.reps)
        guarded(args.out, "shape", run, M=M, N=N, K=K)


if __name__ == "__main__":
    main()
