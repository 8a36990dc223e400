"""The bf16 step's products with each of cuBLASLt's heuristic algorithms timed (H200).

    python3 bench/labs/cublaslt_bf16_algos_gpu.py --out $OUT/cublaslt-bf16-algos.json
        [--reps 10] [--algos 32] [--preset gpu] [--tokens 16384]
    NUMBA_ENABLE_CUDASIM=1 ...            (not supported: cuBLASLt needs a device)

The package (euler/gpu/cublaslt.py) runs each distinct product with the first algorithm of
cublasLtMatmulAlgoGetHeuristic that can run (and, with a separate C, writes D out of
place). Does another of the heuristic's algorithms run the `gpu` step's bf16 products
faster? bench/gemm_bf16_gpu.py timed the two residual products (bf16 operands, float32 C
and D) at 262 and 463 TFLOP/s against 600-790 for the others; their float32 C and D are
100 MB of the 125 that the wo product moves.

For each product of bench/gemm_bf16_gpu.step_products (as --precision bf16 calls it, dW
as called), plus each residual product run in place (C = D = out, beta 1: what it would
cost if the residual stream were updated where it lies), the lab asks the heuristic for
--algos results, keeps those that run, fit the 32 MiB workspace and (with C) write out
of place, and times each (bench/gpu_timing.timed: device time, launch-free, median of
--reps rounds). Each algorithm's output is compared with heuristic #0's (`rel_diff`, max
|out - out0| / max |out0|; bf16 outputs differ by a rounding at most where the algorithms
split K differently).

Records, one JSON line each, the list rewritten to --out after each:
- device: the GPU, cuBLASLt's version;
- product: name, M, N, K, op, out dtype, with_c, accumulate, calls per step; `algos`
  (index, id, tile, split-K, stages, ..., ms, TFLOP/s, rel_diff); `first_ms`, `best_i`,
  `best_ms`, `saving_ms_per_step` = (first_ms - best_ms) x calls;
- summary: the first algorithms' ms a step over the step's products, the saving with each
  product's fastest, and that saving over the residual products alone.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import gpu_timing  # noqa: E402
from bench.gemm_bf16_gpu import Bench, Product, step_products  # noqa: E402
from bench.labs.cublaslt_lab_gpu import LabLt  # noqa: E402
from bench.records import emit, guarded, last_line  # noqa: E402
from euler.gpu import cublaslt  # noqa: E402
from euler.precision import from_bf16  # noqa: E402


class AlgoLt(LabLt):
    """The TF32 lab's CublasLt (describe, version) that lists any product's usable
    heuristic algorithms, bf16 ones included, and runs one."""

    def candidates(self, out, a, b, p: Product, count: int) -> tuple[cublaslt._Plan, list]:
        """The package's plan of p (descriptor and layouts) and the heuristic's usable
        results for it, best estimate first."""
        key = (p.M, p.N, p.K, p.trans_a, p.trans_b, p.with_c, *cublaslt._types(out, a, b))
        plan = self._plan(key, None)
        usable = [
            r for r in self.heuristic(plan, count)
            if r.state == 0 and r.workspaceSize <= self.workspace.nbytes
            and (not p.with_c or self._out_of_place(r.algo))
        ]  # fmt: skip
        return plan, usable

    def run(self, plan, r, out, a, b, c, beta: float) -> None:
        """out = op(a) @ op(b) + beta c (c = out when None) with algorithm r."""
        self._matmul(plan, r.algo, out, a, b, out if c is None else c, ctypes.c_float(beta))


def products(preset: str, tokens: int) -> list[Product]:
    """The step's bf16 products as called (no pre-transposed variants), then each residual
    product in place (variant: not counted in the step's sums)."""
    rows = [p for p in step_products(preset, tokens) if not p.variant]
    in_place = [
        replace(p, name=p.name.replace("+ residual", "in place"), with_c=False,
                accumulate=True, variant=True)
        for p in rows if p.with_c
    ]  # fmt: skip
    return rows + in_place


def timed(stream, fn, reps: int) -> float:
    """gpu_timing.timed after 3 untimed calls, not half a second of them: 15 products of up to
    --algos algorithms would take minutes, and the GPU is busy from the first product on."""
    for _ in range(3):
        fn()
    return gpu_timing.timed(stream, fn, reps, warm_s=0.0)


def host_out(bench: Bench, out, bf16: bool) -> np.ndarray:
    got = out.copy_to_host(stream=bench.stream)
    bench.stream.synchronize()
    return from_bf16(got) if bf16 else got


def measure(bench: Bench, lt: AlgoLt, p: Product, count: int, path: Path | None) -> dict:
    """One product's record: each usable heuristic algorithm timed and compared to #0."""
    a_shape = (p.K, p.M) if p.trans_a else (p.M, p.K)
    b_shape = (p.N, p.K) if p.trans_b else (p.K, p.N)
    a, b = bench.device("a", a_shape, True), bench.device("b", b_shape, True)
    init = bench.host("init", (p.M, p.N), p.out_bf16)
    c = bench.device("c", (p.M, p.N), p.out_bf16) if p.with_c else None
    beta = 1.0 if p.with_c or p.accumulate else 0.0
    plan, algos = lt.candidates(bench.upload(init, p.out_bf16), a, b, p, count)
    rec: dict = {"kind": "product", "name": p.name, "M": p.M, "N": p.N, "K": p.K, "op": p.op,
                 "out": "bf16" if p.out_bf16 else "float32", "with_c": p.with_c,
                 "accumulate": p.accumulate, "calls": p.calls, "variant": p.variant,
                 "usable": len(algos), "algos": []}  # fmt: skip
    first = None
    for i, r in enumerate(algos):
        row: dict = {"i": i, **lt.describe(r)}
        try:
            out = bench.upload(init, p.out_bf16)  # from the same start: accumulate adds to it
            lt.run(plan, r, out, a, b, c, beta)
            got = host_out(bench, out, p.out_bf16)
            if first is None:
                first = got
            scale = max(float(np.max(np.abs(first))), 1e-30)
            row["rel_diff"] = float(np.max(np.abs(got - first)) / scale)
            ms = timed(bench.stream, lambda r=r, out=out: lt.run(plan, r, out, a, b, c, beta),
                       bench.reps)  # fmt: skip
            row["ms"], row["tflops"] = round(ms, 4), round(2 * p.M * p.N * p.K / ms / 1e9, 1)
        except Exception:  # noqa: BLE001 - an algorithm that fails is a result
            row["error"] = last_line()
        rec["algos"].append(row)
    timed_rows = [r for r in rec["algos"] if "ms" in r]
    if timed_rows and "ms" in rec["algos"][0]:
        best = min(timed_rows, key=lambda r: r["ms"])
        rec["first_ms"] = rec["algos"][0]["ms"]
        rec["best_i"], rec["best_ms"] = best["i"], best["ms"]
        rec["saving_ms_per_step"] = round((rec["first_ms"] - best["ms"]) * p.calls, 4)
    emit(path, **rec)
    return rec


def warm_up(bench: Bench, seconds: float = 1.0) -> None:
    """A second of 4096^3 bf16 products, so that the first product timed meets a busy GPU."""
    x = bench.device("warm", (4096, 4096), True)
    out = cuda.device_array((4096, 4096), np.float32, stream=bench.stream)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        bench.lt.gemm(out, x, x)
        bench.stream.synchronize()


def summarize(path: Path | None, recs: list[dict]) -> None:
    step = [r for r in recs if not r["variant"] and "best_ms" in r]
    emit(path, kind="summary", products=len(step),
         first_ms_per_step=round(sum(r["first_ms"] * r["calls"] for r in step), 3),
         best_ms_per_step=round(sum(r["best_ms"] * r["calls"] for r in step), 3),
         saving_ms_per_step=round(sum(r["saving_ms_per_step"] for r in step), 3),
         residual_saving_ms_per_step=round(
             sum(r["saving_ms_per_step"] for r in step if r["with_c"]), 3))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10, help="timed rounds per algorithm")
    ap.add_argument("--algos", type=int, default=32, help="heuristic results asked for")
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--tokens", type=int, default=16384, help="B T of a step")
    ap.add_argument("--out", type=Path, default=None, help="JSON list of every record")
    args = ap.parse_args()
    bench = Bench(args.reps)
    handle = int(getattr(bench.stream.handle, "value", bench.stream.handle))
    workspace = cuda.device_array(bench.lt.workspace.nbytes, np.uint8, stream=bench.stream)
    lt = AlgoLt(handle, workspace)
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    emit(args.out, kind="device", name=name, cc=list(dev.compute_capability),
         cublaslt_version=lt.version, reps=args.reps, preset=args.preset,
         tokens=args.tokens)  # fmt: skip
    warm_up(bench)
    recs = []
    for p in products(args.preset, args.tokens):
        rec = guarded(args.out, p.name, lambda p=p: measure(bench, lt, p, args.algos, args.out))
        if rec:
            recs.append(rec)
    summarize(args.out, recs)
    bench.stream.synchronize()
    lt.close()


if __name__ == "__main__":
    main()
