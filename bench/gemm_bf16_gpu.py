"""bf16 against TF32 matrix products through the package's cuBLAS and cuBLASLt bindings (H200).

    python3 bench/gemm_bf16_gpu.py --json $OUT/gemm-bf16.json    [--reps 10]
    python3 bench/gemm_bf16_gpu.py --preset tiny --tokens 512 --ceiling 512   (a quick check)

Every product runs on one CUDA stream, timed by CUDA events around calls queued behind a
spinning kernel (bench/gpu_timing.timed: the median over --reps rounds of 10 calls, after
half a second of warm-up), so the host's launch cost is not in the figures. TFLOP/s is
2 M N K / time.

(a) ceiling: a bf16 N^3 product (N = --ceiling, 8192 by default; bf16 out, CUBLAS_COMPUTE_32F)
    and the same in TF32 (float32, cublasSgemm with TF32 tensor cores), the rates every
    other row is read against (issue 30 quotes 770-800 TFLOP/s bf16 measured on an H200,
    about 990 on the datasheet, twice TF32's).
(b) the preset's products at --tokens tokens (B T; 16384 = 32 x 512 by default), each as
    the training step calls it (euler/model/transformer.py), with its calls per step:
    forward qkv, wo + residual (c), gate|up, down + residual (c), a head's logits; backward
    each one's dX and dW = dY^T X (trans_a, accumulated into the float32 gradient buffer).
    bf16: euler.gpu.cublaslt.CublasLt with bf16 operands and the out dtype that
    --precision bf16 stores (euler.precision.BF16_TENSORS: qkv, gate|up, logits, dh and
    datt bf16; the residual stream, dxn, dxf and the weight gradients float32).
    tf32: every array float32, run as GpuBackend runs it: Cublas (cublasSgemm_v2, TF32)
    for a plain product, CublasLt (COMPUTE_32F_FAST_TF32) for one with c.
    Each dW also appears with its narrower operand pre-transposed ("dW (T)"), the product
    GpuOptions.transpose_weight_grads makes (the transpose kernel's own time not included).
    Each product is checked once before it is timed: 64 rows of out against a float64
    product of the same (bf16-rounded, for bf16) inputs, plus c or out's previous value;
    rel_err = max |out - ref| / max |ref| over those rows, ok = rel_err < 1e-2.
(c) summary: the products' ms per training step (sum of calls x ms) in bf16 and TF32,
    with the weight gradients as called and pre-transposed.

First run (H200, 2026-12-02, the defaults): ceiling 812 TFLOP/s bf16 against 418 TF32;
the gpu preset's products 17.2 ms a step in bf16 against 41.2 in TF32 (33.2 with the dW
pre-transposed); in bf16 the dW products run as called (TN) at 508-790 TFLOP/s, as fast as
pre-transposed (within 0.003 ms), so the transposes would only add their own time; the two
residual products (bf16 operands, float32 C and D) gain least: wo + residual 0.074 ms in
both precisions, down + residual 0.111 against 0.155.

Prints a table as rows are measured; --json is rewritten with every record so far, so a
run cut short keeps what it measured. An exception becomes an error record and the run
goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import timed  # noqa: E402
from bench.records import last_line  # noqa: E402
from euler.gpu.cublas import Cublas  # noqa: E402
from euler.gpu.cublaslt import CublasLt  # noqa: E402
from euler.model.config import PRESETS  # noqa: E402
from euler.precision import from_bf16, to_bf16  # noqa: E402

CHECK_ROWS = 64  # rows of out compared with a float64 product
TOL = 1e-2  # bf16 outputs round at 2^-9 relative, TF32 products are about 1e-3
WORKSPACE = 32 * 2**20  # bytes, as euler.gpu.backend.CUBLAS_WORKSPACE


@dataclass(frozen=True)
class Product:
    """out (M, N) = op(a) @ op(b) [+ c | accumulated]; out_bf16: its dtype under bf16."""

    name: str
    M: int
    N: int
    K: int
    trans_a: bool = False
    trans_b: bool = False
    out_bf16: bool = False
    with_c: bool = False
    accumulate: bool = False
    calls: int = 1  # per training step
    variant: bool = False  # an alternative layout of a product already counted

    @property
    def op(self) -> str:
        return ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")


def step_products(preset: str, tokens: int) -> list[Product]:
    """The preset's products at `tokens` tokens, forward then backward, as the model makes
    them: x (tokens, D) rows, weights (out, in); dX = dY W, dW = dY^T X."""
    cfg = PRESETS[preset]
    T, D, F, V, Q = tokens, cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.qkv_dim
    L, H = cfg.n_layer, cfg.n_mtp
    rows = [
        Product("qkv", T, Q, D, trans_b=True, out_bf16=True, calls=L),
        Product("wo + residual", T, D, D, trans_b=True, with_c=True, calls=L),
        Product("gate|up", T, 2 * F, D, trans_b=True, out_bf16=True, calls=L),
        Product("down + residual", T, D, F, trans_b=True, with_c=True, calls=L),
        Product("logits", T, V, D, trans_b=True, out_bf16=True, calls=H),
    ]
    # (name, dY width, X width, calls, dX out bf16): dX (T, in) = dY (T, out) W (out, in)
    layers = [("logits", V, D, H, False), ("down", D, F, L, True), ("gate|up", 2 * F, D, L, False),
              ("wo", D, D, L, True), ("qkv", Q, D, L, False)]  # fmt: skip
    for name, out_w, in_w, calls, dx_bf16 in layers:
        rows.append(Product(f"{name} dX", T, in_w, out_w, out_bf16=dx_bf16, calls=calls,
                            accumulate=name == "logits"))  # fmt: skip
        rows.append(Product(f"{name} dW", out_w, in_w, T, trans_a=True, accumulate=True,
                            calls=calls))  # fmt: skip
        # GpuBackend._gemm's pre-transposed form: b^T (in, T) when in <= out, else a^T
        if in_w <= out_w:
            pre = Product(f"{name} dW (T)", out_w, in_w, T, True, True, accumulate=True,
                          calls=calls, variant=True)  # fmt: skip
        else:
            pre = Product(f"{name} dW (T)", out_w, in_w, T, accumulate=True, calls=calls,
                          variant=True)  # fmt: skip
        rows.append(pre)
    return rows


class Report:
    """The records so far, printed as table rows and rewritten to --json after each."""

    HEAD = (f"{'product':<18} {'M':>6} {'N':>6} {'K':>6} {'op':>3} {'out':>5} {'calls':>5} "
            f"{'bf16 ms':>8} {'TF/s':>6} {'tf32 ms':>8} {'TF/s':>6} {'x':>5} "
            f"{'ok':>3}")  # fmt: skip

    def __init__(self, path: Path | None):
        self.path, self.records = path, []

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        if self.path:
            self.path.write_text(json.dumps(self.records, indent=1))

    def row(self, rec: dict) -> None:
        self.add(rec)
        b, t = rec.get("bf16", {}), rec.get("tf32", {})
        out = "bf16" if rec.get("out_bf16") else "f32"
        ok = all(x.get("ok") is True for x in (b, t))
        fmt = lambda x, k, w, p: f"{x[k]:>{w}.{p}f}" if x.get(k) is not None else f"{'-':>{w}}"
        speedup = f"{t['ms'] / b['ms']:>5.2f}" if b.get("ms") and t.get("ms") else f"{'-':>5}"
        print(f"{rec['name']:<18} {rec['M']:>6} {rec['N']:>6} {rec['K']:>6} {rec['op']:>3} "
              f"{out:>5} {rec['calls']:>5} {fmt(b, 'ms', 8, 4)} {fmt(b, 'tflops', 6, 1)} "
              f"{fmt(t, 'ms', 8, 4)} {fmt(t, 'tflops', 6, 1)} {speedup} {'yes' if ok else 'NO':>3}",
              flush=True)  # fmt: skip


class Bench:
    """One stream, its Cublas (TF32) and CublasLt, and cached random inputs."""

    def __init__(self, reps: int):
        self.reps, self.stream = reps, cuda.stream()
        handle = int(getattr(self.stream.handle, "value", self.stream.handle))
        workspace = lambda: cuda.device_array(WORKSPACE, np.uint8, stream=self.stream)
        self.blas = Cublas(handle, tf32=True, workspace=workspace())
        self.lt = CublasLt(handle, workspace(), tf32=True)
        self.rng = np.random.default_rng(0)
        self.hosts: dict[tuple, np.ndarray] = {}
        self.devices: dict[tuple, object] = {}

    def host(self, key: str, shape: tuple, bf16: bool) -> np.ndarray:
        """Standard normal float32 values (bf16-rounded for bf16), the same for every
        product asking for (key, shape, bf16)."""
        k = (key, shape, bf16)
        if k not in self.hosts:
            x = self.rng.standard_normal(shape, dtype=np.float32)
            self.hosts[k] = from_bf16(to_bf16(x)) if bf16 else x
        return self.hosts[k]

    def device(self, key: str, shape: tuple, bf16: bool):
        """host(key, shape, bf16) on the device, as float32 or bf16 bits (uint16); cached."""
        k = (key, shape, bf16)
        if k not in self.devices:
            self.devices[k] = self.upload(self.host(key, shape, bf16), bf16)
        return self.devices[k]

    def upload(self, x: np.ndarray, bf16: bool):
        return cuda.to_device(to_bf16(x) if bf16 else x, stream=self.stream)

    def measure(self, p: Product, bf16: bool) -> dict:
        """One product's check and time in bf16 or TF32: {ms, tflops, rel_err, ok}."""
        a_shape = (p.K, p.M) if p.trans_a else (p.M, p.K)
        b_shape = (p.N, p.K) if p.trans_b else (p.K, p.N)
        a, b = self.device("a", a_shape, bf16), self.device("b", b_shape, bf16)
        out_bf16 = bf16 and p.out_bf16
        init = self.host("init", (p.M, p.N), out_bf16)
        out = self.upload(init, out_bf16)  # a fresh out: the cached arrays stay as they are
        c = self.device("c", (p.M, p.N), out_bf16) if p.with_c else None
        if bf16 or p.with_c:  # as GpuBackend: cuBLASLt for bf16 and for a separate C
            fn = lambda: self.lt.gemm(out, a, b, p.trans_a, p.trans_b, p.accumulate, c=c)
        else:
            fn = lambda: self.blas.gemm(out, a, b, p.trans_a, p.trans_b, p.accumulate)
        fn()
        rows = slice(0, CHECK_ROWS)
        a_host, b_host = self.host("a", a_shape, bf16), self.host("b", b_shape, bf16)
        ref = (a_host.T if p.trans_a else a_host)[rows].astype(np.float64)
        ref = ref @ (b_host.T if p.trans_b else b_host)
        if p.with_c:
            ref += self.host("c", (p.M, p.N), out_bf16)[rows]
        if p.accumulate:
            ref += init[rows]
        got = out[rows].copy_to_host(stream=self.stream)
        self.stream.synchronize()
        got = from_bf16(got) if out_bf16 else got
        err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
        ms = timed(self.stream, fn, self.reps)
        return {"ms": round(ms, 4), "tflops": round(2 * p.M * p.N * p.K / ms / 1e9, 1),
                "rel_err": err, "ok": err < TOL}  # fmt: skip

    def release(self) -> None:
        """Drop the cached inputs (the ceiling's, before the preset's shapes)."""
        self.stream.synchronize()
        self.hosts.clear()
        self.devices.clear()


def record(p: Product) -> dict:
    return {"kind": "gemm", "name": p.name, "M": p.M, "N": p.N, "K": p.K, "op": p.op,
            "out_bf16": p.out_bf16, "with_c": p.with_c, "accumulate": p.accumulate,
            "calls": p.calls, "variant": p.variant}  # fmt: skip


def measure_row(bench: Bench, report: Report, p: Product) -> dict:
    """Both precisions of p, each caught: a failure is its error string."""
    rec = record(p)
    for precision in ("bf16", "tf32"):
        try:
            rec[precision] = bench.measure(p, precision == "bf16")
        except Exception:  # noqa: BLE001 - every failure is a result to report
            rec[precision] = {"error": last_line()}
            print(f"{p.name} {precision}: {rec[precision]['error']}", flush=True)
    report.row(rec)
    return rec


def summary(rows: list[dict]) -> dict:
    """The products' ms per step (calls x ms summed) in each precision, with the weight
    gradients as called and pre-transposed ("dW (T)"); None where one of them failed."""
    as_called = [r for r in rows if not r["variant"]]
    transposed = [r for r in rows if r["variant"] or not r["name"].endswith(" dW")]

    def total(picked: list[dict], precision: str) -> float | None:
        ms = [r[precision].get("ms") for r in picked]
        if None in ms:
            return None
        return round(sum(m * r["calls"] for m, r in zip(ms, picked, strict=True)), 3)

    out: dict = {"kind": "summary"}
    for precision in ("bf16", "tf32"):
        out[f"{precision}_ms_per_step"] = total(as_called, precision)
        out[f"{precision}_ms_per_step_dw_transposed"] = total(transposed, precision)
    b, t = out["bf16_ms_per_step"], out["tf32_ms_per_step"]
    out["speedup"] = round(t / b, 3) if b and t else None
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="JSON list of every record")
    ap.add_argument("--reps", type=int, default=10, help="timed rounds per measurement")
    ap.add_argument("--preset", default="gpu", choices=sorted(PRESETS), help="model shapes")
    ap.add_argument("--tokens", type=int, default=16384, help="B T of a step (default 32 x 512)")
    ap.add_argument("--ceiling", type=int, default=8192, help="N of the N^3 ceiling product")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = Report(args.json)
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    report.add({"kind": "device", "name": name, "cc": list(dev.compute_capability),
                "sms": dev.MULTIPROCESSOR_COUNT, "reps": args.reps, "preset": args.preset,
                "tokens": args.tokens})  # fmt: skip
    print(f"{name}, cc {dev.compute_capability}: preset {args.preset}, {args.tokens} tokens")
    bench = Bench(args.reps)
    print(Report.HEAD)
    n = args.ceiling
    measure_row(bench, report, Product(f"ceiling {n}^3", n, n, n, out_bf16=True))
    bench.release()
    rows = [measure_row(bench, report, p) for p in step_products(args.preset, args.tokens)]
    total = summary(rows)
    report.add(total)
    print(json.dumps(total))


if __name__ == "__main__":
    main()
