"""cuBLASLt against our legacy cublasSgemm_v2 calls, and the residual add fused into a GEMM.

    python3 bench/labs/cublaslt_lab_gpu.py --out $OUT/cublaslt-lab.json    [--reps 10]

Two questions, on the `gpu` preset's training step (16384 tokens, TF32 tensor cores,
row-major float32, compute type CUBLAS_COMPUTE_32F_FAST_TF32):
1. Does cuBLASLt, with its heuristic's top 8 algorithms timed one by one, beat the legacy
   `cublasSgemm_v2` (be.matmul) on each distinct product of the step?
2. cuBLASLt computes D = alpha op(A) op(B) + beta C with separate C and D pointers; legacy
   cuBLAS cannot (C is both input and output). The two output projections that feed a
   residual add (attn.wo and mlp.w_down, 16 calls a step each, one a layer) could then write
   xmid = x + att Wo^T in one call, dropping the residual kernel and its read of tmp.

The binding is the package's (euler/gpu/cublaslt.py: header values, structures, row-major
mapping), extended here to list, describe and run each of the heuristic's algorithms.

One JSON line per record (median ms of --reps runs from CUDA events after a warm-up;
TFLOP/s = 2 M N K / time); --out is rewritten with every record so far:
- device: the GPU, the cuBLASLt library (path, version), ctypes struct sizes against the
  header's (a mismatch skips cuBLASLt rather than corrupt memory);
- gemm (one per shape): `legacy_ms`/`legacy_tflops` (be.matmul) and `ref_tflops` (legacy
  as this lab first measured it on an H200); `algos`: each heuristic result (index,
  workspace, waves, algo id, tile, split-K, stages, ...) with its ms and TFLOP/s, or its
  error; `lt0_*`: heuristic #0 (cuBLASLt without autotuning); `best_*`: the fastest;
  `speedup` = legacy_ms / best_ms; `rel_err` = max |best - legacy| / max |legacy| and
  `ok` = rel_err < 1e-2 (two TF32 results); `saving_ms_per_step` = (legacy_ms - best_ms)
  * calls_per_step;
- residual_fusion (two shapes): `gemm_ms` (legacy GEMM into tmp), `add_ms` (our add kernel
  out = x + tmp alone), `unfused_ms` (a: both), `lt_gemm_plus_add_ms` (cuBLASLt's best
  algorithm into tmp, then the add), `fused_ms` (b: one cuBLASLt call, beta = 1, C = x,
  D = out, best of the heuristic's algorithms, each listed in `algos`), `rel_err`/`ok` of
  (b) against (a), `c_untouched` (x still equal to its host copy after (b)), and
  `saving_ms_per_step` = (unfused_ms - fused_ms) * calls_per_step;
- summary: per-step sums over the shapes measured: `legacy_ms_per_step`, the saving with
  each shape's best algorithm (`best_saving_ms_per_step`, negative where cuBLASLt is
  slower), with heuristic #0 (`lt0_saving_ms_per_step`), keeping the faster of legacy and
  best per shape (`faster_saving_ms_per_step`), and the fusion's
  (`fusion_saving_ms_per_step`).
Every measurement is wrapped: an exception becomes a {"kind": "error"} record and the run
goes on.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_gpu import timed  # noqa: E402
from bench.records import emit, guarded, last_line, rel_err  # noqa: E402
from euler.gpu import cublaslt  # noqa: E402
from euler.gpu.backend import CUBLAS_WORKSPACE, GpuBackend  # noqa: E402
from euler.gpu.cublas import Cublas, CublasError  # noqa: E402

# (M, N, K, trans_a, trans_b, calls per step, legacy TFLOP/s measured on the H200 before)
SHAPES = [
    (4096, 768, 16384, True, False, 20, 190),
    (16384, 4096, 768, False, True, 20, 333),
    (768, 2048, 16384, True, False, 16, 159),
    (16384, 768, 4096, False, False, 17, 342),
    (16384, 2048, 768, False, False, 16, 269),
    (1280, 768, 16384, True, False, 16, 172),
    (16384, 768, 2048, False, True, 16, 310),
    (768, 768, 16384, True, False, 16, 121),
    (16384, 768, 1280, False, False, 16, 246),
    (16384, 1280, 768, False, True, 16, 272),
    (16384, 768, 768, False, False, 16, 178),
    (16384, 768, 768, False, True, 16, 243),
]
# the forward products whose output feeds a residual add: attn.wo and mlp.w_down
FUSED = [(16384, 768, 768, False, True, 16), (16384, 768, 2048, False, True, 16)]
ALGOS = 8  # heuristic results requested and timed per shape
ADD_THREADS = 256
TOL = 1e-2  # relative max error between two TF32 results

# cublasLtMatmulAlgoConfigAttributes_t (cublasLt.h; name, value, C type): read back to
# describe an algorithm. The binding's own header values are euler/gpu/cublaslt.py's.
ALGO_CONFIG = [
    ("id", 0, ctypes.c_int32),  # CUBLASLT_ALGO_CONFIG_ID
    ("tile", 1, ctypes.c_uint32),  # CUBLASLT_ALGO_CONFIG_TILE_ID (cublasLtMatmulTile_t)
    ("splitk", 2, ctypes.c_int32),  # CUBLASLT_ALGO_CONFIG_SPLITK_NUM
    ("reduction", 3, ctypes.c_uint32),  # CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME
    ("swizzle", 4, ctypes.c_uint32),  # CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING
    ("stages", 6, ctypes.c_uint32),  # CUBLASLT_ALGO_CONFIG_STAGES_ID
    ("cluster", 8, ctypes.c_uint16),  # CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
]
# cublasLtMatmulTile_t, a few common ids (rows x cols of C/D, column-major: N x M here)
TILES = {15: "64x64", 17: "64x128", 18: "128x64", 19: "64x256", 20: "128x128", 21: "256x64",
         23: "128x256", 24: "256x128", 28: "96x128", 33: "128x96", 32: "128x192",
         31: "192x128"}  # fmt: skip


def struct_sizes() -> dict[str, dict[str, int]]:
    """ctypes.sizeof of the structures passed to cuBLASLt, and the sizes the header implies
    (the binding refuses to start on a mismatch rather than corrupt memory)."""
    return {
        "struct_sizes": {s.__name__: ctypes.sizeof(s) for s in cublaslt.STRUCT_SIZES},
        "struct_sizes_expected": {s.__name__: n for s, n in cublaslt.STRUCT_SIZES.items()},
    }


class LabPlan(cublaslt._Plan):
    """The binding's descriptor and layouts of one product, with its shape (no algorithm
    chosen: the lab times each of the heuristic's)."""

    def __init__(self, M: int, N: int, K: int, trans_a: bool, trans_b: bool):
        super().__init__()
        self.M, self.N, self.K, self.trans_a, self.trans_b = M, N, K, trans_a, trans_b


class LabLt(cublaslt.CublasLt):
    """euler.gpu.cublaslt.CublasLt (TF32) that lists the heuristic's algorithms, describes
    them, and runs a product with a given one."""

    def __init__(self, stream_handle: int, workspace):
        super().__init__(stream_handle, workspace, tf32=True)
        lib, sz = self.lib, ctypes.c_size_t
        fn = lib.cublasLtMatmulAlgoConfigGetAttribute
        fn.argtypes = [ctypes.POINTER(cublaslt.MatmulAlgo), ctypes.c_int, ctypes.c_void_p, sz,
                       ctypes.POINTER(sz)]  # fmt: skip
        fn.restype = ctypes.c_int
        lib.cublasLtGetVersion.argtypes, lib.cublasLtGetVersion.restype = [], sz
        lib.cublasLtGetCudartVersion.argtypes, lib.cublasLtGetCudartVersion.restype = [], sz
        self.path = getattr(lib, "_name", None)
        self.version = int(lib.cublasLtGetVersion())
        self.cudart_version = int(lib.cublasLtGetCudartVersion())

    def plan(self, M: int, N: int, K: int, trans_a: bool, trans_b: bool) -> LabPlan:
        """Descriptor and layouts for out (M, N) = op(a) @ op(b), all row-major float32."""
        p = LabPlan(M, N, K, trans_a, trans_b)
        self._plans[("lab", len(self._plans))] = p  # destroyed by close(), even on failure
        self._describe(p, M, N, K, trans_a, trans_b)
        return p

    def heuristics(self, p: LabPlan, count: int = ALGOS) -> list:
        """The heuristic's results for plan p, best estimate first: those with state 0 whose
        workspace fits ours."""
        return [
            r for r in self.heuristic(p, count)
            if r.state == 0 and r.workspaceSize <= self.workspace.nbytes
        ]  # fmt: skip

    def describe(self, r) -> dict:
        """An algorithm's configuration as read back from it (None where a query fails)."""
        info: dict = {"workspace": int(r.workspaceSize), "waves": round(float(r.wavesCount), 3)}
        written = ctypes.c_size_t(0)
        for name, attr, ctype in ALGO_CONFIG:
            val = ctype(0)
            status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(r.algo), attr, ctypes.byref(val), ctypes.sizeof(val),
                ctypes.byref(written),
            )  # fmt: skip
            info[name] = int(val.value) if status == 0 else None
        if info.get("tile") in TILES:
            info["tile_shape"] = TILES[info["tile"]]
        try:
            info["out_of_place"] = self._out_of_place(r.algo)
        except CublasError:
            info["out_of_place"] = None
        return info

    def matmul(self, p: LabPlan, r, out, a, b, c=None, beta: float = 0.0) -> None:
        """out = op(a) @ op(b) + beta c (c defaults to out) with algorithm r, on the stream."""
        M, N, K = Cublas._dims(out, a, b, p.trans_a, p.trans_b)
        if (M, N, K) != (p.M, p.N, p.K):
            raise ValueError(f"plan is for {(p.M, p.N, p.K)}, arrays give {(M, N, K)}")
        c = out if c is None else c
        if c.shape != out.shape or not c.is_c_contiguous() or c.dtype != out.dtype:
            raise ValueError(f"C {c.shape} {c.dtype} must match D {out.shape} {out.dtype}")
        self._matmul(p, r.algo, out, a, b, c, ctypes.c_float(beta))


@cuda.jit
def add_kernel(out, x, y):
    """out[i] = x[i] + y[i] over flat float32 arrays: one thread per element, grid-stride."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = x[i] + y[i]
        i += stride


def add(stream, out, x, y) -> None:
    """Launch add_kernel: out = x + y (same shapes, C-contiguous) on stream."""
    n = out.size
    if x.shape != out.shape or y.shape != out.shape:
        raise ValueError(f"add: shapes {out.shape}, {x.shape}, {y.shape}")
    blocks = min((n + ADD_THREADS - 1) // ADD_THREADS, 1 << 20)
    add_kernel[blocks, ADD_THREADS, stream](out.reshape(n), x.reshape(n), y.reshape(n))


def tflops(M: int, N: int, K: int, ms: float | None) -> float | None:
    return None if not ms else round(2 * M * N * K / ms / 1e9, 1)


class Inputs:
    """Random device arrays (standard normal), one per shape, reused across products."""

    def __init__(self, be: GpuBackend):
        self.be, self.rng, self.cache = be, np.random.default_rng(0), {}

    def __call__(self, *shape: int):
        if shape not in self.cache:
            host = self.rng.standard_normal(shape, dtype=np.float32)
            self.cache[shape] = self.be.to_device(host)
        return self.cache[shape]


def operands(inputs: Inputs, M: int, N: int, K: int, trans_a: bool, trans_b: bool) -> tuple:
    """(a, b) device arrays for out (M, N) = op(a) @ op(b)."""
    a = inputs(K, M) if trans_a else inputs(M, K)
    b = inputs(N, K) if trans_b else inputs(K, N)
    return a, b


def time_algos(be: GpuBackend, lt: LabLt, p: LabPlan, algos: list, run, reps: int) -> list[dict]:
    """Each algorithm's description, ms, or error; run(r) launches one call with r."""
    rows = []
    for i, r in enumerate(algos):
        row: dict = {"i": i}
        try:
            row.update(lt.describe(r))
        except Exception:  # noqa: BLE001
            row["describe_error"] = last_line()
        try:
            row["ms"] = round(timed(be, lambda r=r: run(r), reps), 4)
            row["tflops"] = tflops(p.M, p.N, p.K, row["ms"])
        except Exception:  # noqa: BLE001 - a failing algorithm is a result
            row["error"] = last_line()
        rows.append(row)
    return rows


def best_of(rows: list[dict]) -> int | None:
    """Index of the fastest timed row, or None."""
    timed_rows = [r for r in rows if "ms" in r]
    return min(timed_rows, key=lambda r: r["ms"])["i"] if timed_rows else None


def bench_shape(
    be: GpuBackend, lt: LabLt | None, inputs: Inputs, path: Path | None, shape: tuple, reps: int
) -> dict:
    """The gemm record of one product: legacy, then each heuristic algorithm."""
    M, N, K, trans_a, trans_b, calls, ref_tflops = shape
    a, b = operands(inputs, M, N, K, trans_a, trans_b)
    rec: dict = {"kind": "gemm", "M": M, "N": N, "K": K, "trans_a": trans_a,
                 "trans_b": trans_b, "calls_per_step": calls, "ref_tflops": ref_tflops}  # fmt: skip
    out_ref = be.zeros((M, N), np.float32)
    ref = None
    try:
        ms = timed(be, lambda: be.matmul(out_ref, a, b, trans_a, trans_b), reps)
        rec["legacy_ms"], rec["legacy_tflops"] = round(ms, 4), tflops(M, N, K, ms)
        ref = be.to_host(out_ref)
    except Exception:  # noqa: BLE001
        rec["legacy_error"] = last_line()
    if lt is None:
        rec["lt_error"] = "cuBLASLt unavailable (see the error record above)"
        emit(path, **rec)
        return rec
    try:
        p = lt.plan(M, N, K, trans_a, trans_b)
        algos = lt.heuristics(p)
        rec["heuristic_count"] = len(algos)
        out = be.zeros((M, N), np.float32)
        rows = time_algos(be, lt, p, algos, lambda r: lt.matmul(p, r, out, a, b), reps)
        rec["algos"] = rows
        if rows and "ms" in rows[0]:
            rec["lt0_ms"], rec["lt0_tflops"] = rows[0]["ms"], rows[0]["tflops"]
        best = best_of(rows)
        if best is not None:
            rec["best_i"], rec["best_ms"] = best, rows[best]["ms"]
            rec["best_tflops"] = rows[best]["tflops"]
            lt.matmul(p, algos[best], out, a, b)
            err = rel_err(be.to_host(out), ref)
            rec["rel_err"], rec["ok"] = err, None if err is None else err < TOL
            if "legacy_ms" in rec:
                rec["speedup"] = round(rec["legacy_ms"] / rec["best_ms"], 3)
                rec["saving_ms_per_step"] = round((rec["legacy_ms"] - rec["best_ms"]) * calls, 4)
    except Exception:  # noqa: BLE001
        rec["lt_error"] = last_line()
    emit(path, **rec)
    return rec


def bench_fused(
    be: GpuBackend, lt: LabLt | None, inputs: Inputs, path: Path | None, shape: tuple, reps: int
) -> dict:
    """The residual_fusion record: legacy GEMM + add kernel against one cuBLASLt call."""
    M, N, K, trans_a, trans_b, calls = shape
    a, b = operands(inputs, M, N, K, trans_a, trans_b)
    rec: dict = {"kind": "residual_fusion", "M": M, "N": N, "K": K, "trans_a": trans_a,
                 "trans_b": trans_b, "calls_per_step": calls}  # fmt: skip
    x_host = np.random.default_rng(1).standard_normal((M, N), dtype=np.float32)
    x = be.to_device(x_host)
    tmp, out_a, out_b = (be.zeros((M, N), np.float32) for _ in range(3))
    ms_of = lambda fn: round(timed(be, fn, reps), 4)

    def unfused() -> None:
        be.matmul(tmp, a, b, trans_a, trans_b)
        add(be.stream, out_a, x, tmp)

    ref = None
    try:
        rec["gemm_ms"] = ms_of(lambda: be.matmul(tmp, a, b, trans_a, trans_b))
        rec["add_ms"] = ms_of(lambda: add(be.stream, out_a, x, tmp))
        rec["unfused_ms"] = ms_of(unfused)
        ref = be.to_host(out_a)
        rec["add_rel_err"] = rel_err(ref, x_host + be.to_host(tmp))  # the add kernel itself
    except Exception:  # noqa: BLE001
        rec["unfused_error"] = last_line()
    if lt is None:
        rec["lt_error"] = "cuBLASLt unavailable (see the error record above)"
        emit(path, **rec)
        return rec
    try:
        p = lt.plan(M, N, K, trans_a, trans_b)
        algos = lt.heuristics(p)
        rec["heuristic_count"] = len(algos)
        run = lambda r: lt.matmul(p, r, out_b, a, b, c=x, beta=1.0)
        rows = time_algos(be, lt, p, algos, run, reps)
        rec["algos"] = rows
        best = best_of(rows)
        if best is not None:
            rec["best_i"], rec["fused_ms"] = best, rows[best]["ms"]
            rec["fused_gemm_tflops"] = rows[best]["tflops"]
            run(algos[best])
            err = rel_err(be.to_host(out_b), ref)
            rec["rel_err"], rec["ok"] = err, None if err is None else err < TOL
            rec["c_untouched"] = bool(np.array_equal(be.to_host(x), x_host))
            if "unfused_ms" in rec:
                rec["speedup"] = round(rec["unfused_ms"] / rec["fused_ms"], 3)
                saving = (rec["unfused_ms"] - rec["fused_ms"]) * calls
                rec["saving_ms_per_step"] = round(saving, 4)

            def lt_then_add() -> None:
                lt.matmul(p, algos[best], tmp, a, b)
                add(be.stream, out_a, x, tmp)

            rec["lt_gemm_plus_add_ms"] = ms_of(lt_then_add)
    except Exception:  # noqa: BLE001
        rec["lt_error"] = last_line()
    emit(path, **rec)
    return rec


def summarize(path: Path | None, gemms: list[dict], fused: list[dict]) -> None:
    """The per-step totals over the shapes measured."""
    legacy = best = lt0 = faster = 0.0
    complete = 0
    for r in gemms:
        if "legacy_ms" not in r or "best_ms" not in r:
            continue
        complete += 1
        c = r["calls_per_step"]
        legacy += r["legacy_ms"] * c
        best += (r["legacy_ms"] - r["best_ms"]) * c
        faster += max(0.0, r["legacy_ms"] - r["best_ms"]) * c
        if "lt0_ms" in r:
            lt0 += (r["legacy_ms"] - r["lt0_ms"]) * c
    fusion = sum(r.get("saving_ms_per_step", 0.0) for r in fused)
    emit(path, kind="summary", shapes=len(SHAPES), shapes_complete=complete,
         legacy_ms_per_step=round(legacy, 3), best_saving_ms_per_step=round(best, 3),
         lt0_saving_ms_per_step=round(lt0, 3), faster_saving_ms_per_step=round(faster, 3),
         fusion_shapes_complete=sum("saving_ms_per_step" in r for r in fused),
         fusion_saving_ms_per_step=round(fusion, 3))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10, help="timed runs per measurement")
    ap.add_argument("--out", type=Path, default=None, help="JSON list of every record")
    args = ap.parse_args()
    be = GpuBackend(tf32=True)
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)

    def make_lt() -> LabLt:
        handle = be.stream.handle
        workspace = cuda.device_array(CUBLAS_WORKSPACE, np.uint8, stream=be.stream)
        return LabLt(int(getattr(handle, "value", handle)), workspace)

    lt = guarded(args.out, "cublasLt setup", make_lt)
    emit(args.out, kind="device", name=name, cc=list(dev.compute_capability),
         sms=dev.MULTIPROCESSOR_COUNT, tf32=be.blas.tf32, reps=args.reps,
         cublas=getattr(be.blas.lib, "_name", None),
         cublaslt=None if lt is None else lt.path,
         cublaslt_version=None if lt is None else lt.version,
         cublaslt_cudart_version=None if lt is None else lt.cudart_version,
         **struct_sizes())  # fmt: skip
    inputs = Inputs(be)
    gemms, fused = [], []
    try:
        for shape in SHAPES:
            run = lambda s=shape: bench_shape(be, lt, inputs, args.out, s, args.reps)
            rec = guarded(args.out, "gemm", run, M=shape[0], N=shape[1], K=shape[2],
                          trans_a=shape[3], trans_b=shape[4])  # fmt: skip
            if rec:
                gemms.append(rec)
        for shape in FUSED:
            run = lambda s=shape: bench_fused(be, lt, inputs, args.out, s, args.reps)
            rec = guarded(args.out, "residual_fusion", run, M=shape[0], N=shape[1],
                          K=shape[2], trans_a=shape[3], trans_b=shape[4])  # fmt: skip
            if rec:
                fused.append(rec)
        guarded(args.out, "summary", lambda: summarize(args.out, gemms, fused))
    finally:
        if lt is not None:
            guarded(args.out, "close", lambda: (be.synchronize(), lt.close()))


if __name__ == "__main__":
    main()
