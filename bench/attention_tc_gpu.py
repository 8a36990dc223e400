"""Tensor-core FlashAttention (TF32 or bf16) against the exact fp32 kernels and torch SDPA,
checked and timed on a GPU.

    python bench/attention_tc_gpu.py --out attention-tc.json
    python bench/attention_tc_gpu.py --precision bf16 --out attention-tc-bf16.json

For each case (small shapes first: a correctness check of tail tiles and head sizes on the
hardware; then B=32, H=12, G=4, E=64 at T=512 and 2048) it prints one JSON line per
measurement as it goes, and rewrites --out after each, so a failure (an exception is
recorded as {"error": ...}) loses nothing measured before it:

- "check": max abs error of attention_tc's out, lse, dqkv against a float64 NumPy
  reference (batch element 0 only at the big shapes), and against the exact kernels of
  attention.py. Errors are TF32-sized (~1e-3 of the values' scale), not fp32-sized.
- "time": median device ms of one call over --reps rounds (bench/gpu_timing.py: a round is
  10 calls back to back, queued behind a spin, so the host's launch is not timed) of
  forward and backward for attention_tc (TF32), the exact fp32 kernels, torch SDPA when
  torch has CUDA, and the naive attention (scores in memory) at the big shapes; TFLOP/s of
  useful causal work, 4 B H T^2 E / 2 forward and 2.5 times that backward.
- "registers": registers per thread of each attention_tc kernel at E = 64.

With --precision bf16, the bf16 kernels (TcOptions(bf16=True): qkv, dout and out bf16; lse,
dqkv float32) run on inputs rounded to bf16, checked against float64 of those same values;
the exact fp32 kernels are left out, the small cases take T a multiple of 64 (the bf16
backward's), and torch SDPA runs on the same bf16 values in bf16 with its flash backend
forced (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)), its output checked
against the same float64 reference. The naive attention reads them in float32 (TF32).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import CALLS, timed  # noqa: E402
from euler.gpu import attention, attention_tc  # noqa: E402
from euler.gpu.backend import GpuBackend  # noqa: E402
from euler.gpu.naive_attention import NaiveAttention  # noqa: E402
from euler.precision import from_bf16, to_bf16  # noqa: E402
from tests.numpy_reference import attention_with_grads  # noqa: E402

RECORDS: list[dict] = []
REFERENCES: dict[tuple, tuple] = {}  # float64 reference results by shape, seed and batch


def emit(path: Path | None, /, **rec) -> None:
    """Print one record as a JSON line and rewrite the output file with every record so far."""
    RECORDS.append(rec)
    print(json.dumps(rec), flush=True)
    if path:
        path.write_text(json.dumps(RECORDS, indent=1))


def guarded(out: Path | None, what: str, **ctx):
    """guarded(...)(fn) runs fn(); if it raises: an error record (traceback tail), None."""

    def wrap(fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - every failure is a result to report
            tb = traceback.format_exc().splitlines()[-6:]
            emit(out, kind="error", what=what, error=f"{type(e).__name__}: {e}", tb=tb, **ctx)
            return None

    return wrap


class Case:
    """Device arrays of one shape, and the forward/backward calls of each implementation."""

    def __init__(self, B, T, H, G, E, seed=0, bf16=False):
        self.B, self.T, self.H, self.G, self.E, self.seed = B, T, H, G, E, seed
        self.bf16 = bf16
        rng = np.random.default_rng(seed)
        self.qkv_h = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
        self.dout_h = rng.standard_normal((B, T, H * E)).astype(np.float32)
        self.stream = cuda.stream()
        if bf16:  # bf16 bits on the device; the host copies hold the same values in float32
            qkv, dout = to_bf16(self.qkv_h), to_bf16(self.dout_h)
            self.qkv_h, self.dout_h = from_bf16(qkv), from_bf16(dout)
        else:
            qkv, dout = self.qkv_h, self.dout_h
        self.qkv, self.dout = cuda.to_device(qkv), cuda.to_device(dout)
        self.out = cuda.device_array((B, T, H * E), np.uint16 if bf16 else np.float32)
        self.lse = cuda.device_array((B, H, T), np.float32)
        self.dqkv = cuda.device_array(self.qkv_h.shape, np.float32)
        self.dsum = cuda.device_array((B, H, T), np.float32)

    def fwd(self, mod):
        mod.attention_forward(self.out, self.lse, self.qkv, self.H, self.G, self.E, self.stream)

    def bwd(self, mod):
        mod.attention_backward(
            self.dqkv, self.dout, self.qkv, self.out, self.lse, self.H, self.G, self.E,
            self.dsum, self.stream,
        )  # fmt: skip

    def results(self, mod):
        """(out, lse, dqkv) on the host from mod's forward then backward."""
        self.dqkv.copy_to_device(np.full(self.qkv_h.shape, np.nan, np.float32))
        self.fwd(mod)
        self.bwd(mod)
        self.stream.synchronize()
        out = self.out.copy_to_host()
        out = from_bf16(out) if self.bf16 else out
        return out, self.lse.copy_to_host(), self.dqkv.copy_to_host()


def max_errors(got, want) -> dict:
    names = ("out", "lse", "dqkv")
    err = {n: float(np.abs(g - w).max()) for n, g, w in zip(names, got, want, strict=True)}
    err.update({f"{n}_scale": float(np.abs(w).max()) for n, w in zip(names, want, strict=True)})
    return err


def check(c: Case, out: Path | None, exact: bool, ref_batch: int | None, **tag) -> None:
    """Errors of attention_tc against the float64 reference (computed once per shape and
    batch) and, if exact, against attention.py's kernels; tag: extra fields of the records."""
    shape = dict(B=c.B, T=c.T, H=c.H, G=c.G, E=c.E)
    t0 = time.time()
    tc = guarded(out, "tc forward+backward", **shape, **tag)(lambda: c.results(attention_tc))
    if tc is None:
        return
    compile_s = time.time() - t0
    nb = c.B if ref_batch is None else ref_batch
    key = (*shape.values(), c.seed, nb)
    if key not in REFERENCES:
        REFERENCES[key] = attention_with_grads(c.qkv_h[:nb], c.dout_h[:nb], c.H, c.G, c.E)
    err = max_errors([x[:nb] for x in tc], REFERENCES[key])
    finite = all(bool(np.isfinite(x).all()) for x in tc)
    emit(out, kind="check", against=f"numpy float64, batch[:{nb}]", finite=finite,
         first_call_s=compile_s, **tag, **shape, **err)  # fmt: skip
    if exact:
        ex = guarded(out, "exact forward+backward", **shape)(lambda: c.results(attention))
        if ex is not None:
            emit(out, kind="check", against="exact fp32 kernels", **shape, **max_errors(tc, ex))


def time_case(
    c: Case, out: Path | None, reps: int, exact: bool, torch=True, more=False, **tag
) -> None:  # fmt: skip
    """Times of attention_tc, the exact kernels (if exact), torch SDPA (if torch) and, if
    more, the naive attention (scores materialised, TF32 cuBLAS); tag: extra fields of the
    records."""
    shape = dict(B=c.B, T=c.T, H=c.H, G=c.G, E=c.E)
    useful = 4 * c.B * c.H * c.T * c.T * c.E / 2
    tc = "tc bf16" if c.bf16 else "tc"
    impls = [(tc, attention_tc)] + ([("exact", attention)] if exact else [])
    for name, mod in impls:

        def run(mod=mod):
            f = timed(c.stream, lambda: c.fwd(mod), reps)
            b = timed(c.stream, lambda: c.bwd(mod), reps)
            return f, b

        r = guarded(out, f"time {name}", **shape, **tag)(run)
        if r:
            f, b = r
            tflops = dict(fwd_tflops=useful / f / 1e9, bwd_tflops=2.5 * useful / b / 1e9)
            emit(
                out,
                kind="time",
                impl=name,
                fwd_ms=f,
                bwd_ms=b,
                bwd_over_fwd=b / f,
                **tflops,
                **tag,
                **shape,
            )
    if torch:
        guarded(out, "time torch sdpa", **shape)(lambda: time_torch(c, out, reps, useful, shape))
        if c.bf16:  # the same, with torch's own GQA (k, v not repeated), if flash takes it
            guarded(out, "time torch sdpa gqa", **shape)(
                lambda: time_torch(c, out, reps, useful, shape, gqa=True)
            )
    if more:
        guarded(out, "time naive", **shape)(lambda: time_naive(c, out, reps, useful, shape))


def time_naive(c: Case, out: Path | None, reps: int, useful: float, shape: dict) -> None:
    """The naive attention (euler/gpu/naive_attention.py) on the same data."""
    be = GpuBackend(tf32=True)
    naive = NaiveAttention(be, c.qkv_h, c.dout_h, c.H, c.G, c.E)
    f, b = timed(be.stream, naive.forward, reps), timed(be.stream, naive.backward, reps)
    emit(out, kind="time", impl="naive (scores in memory, TF32 cuBLAS)", fwd_ms=f, bwd_ms=b,
         bwd_over_fwd=b / f, fwd_tflops=useful / f / 1e9, bwd_tflops=2.5 * useful / b / 1e9,
         scores_gib=naive.scores_bytes() / 2**30, **shape)  # fmt: skip


def time_torch(
    c: Case, out: Path | None, reps: int, useful: float, shape: dict, gqa: bool = False
) -> None:  # fmt: skip
    """torch SDPA (causal) on the same data, if torch has CUDA: fp32 inputs with TF32
    allowed, or for a bf16 case bf16 inputs with the flash backend forced; k, v repeated to
    the query heads, or with gqa, SDPA's enable_gqa on the kv heads as they are."""
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    import contextlib

    torch.backends.cuda.matmul.allow_tf32 = True
    F = torch.nn.functional
    H, G, E, rep = c.H, c.G, c.E, c.H // c.G
    dtype = torch.bfloat16 if c.bf16 else torch.float32  # the bf16 values convert exactly
    x = torch.from_numpy(c.qkv_h).cuda().to(dtype)
    q = x[..., : H * E].reshape(c.B, c.T, H, E).transpose(1, 2).contiguous().requires_grad_()
    kv = [
        x[..., o : o + G * E].reshape(c.B, c.T, G, E).transpose(1, 2) for o in (H * E, (H + G) * E)
    ]
    if gqa:
        k, v = (t.contiguous().requires_grad_() for t in kv)
    else:
        k, v = (t.repeat_interleave(rep, 1).contiguous().requires_grad_() for t in kv)
    do = torch.from_numpy(c.dout_h).cuda().to(dtype).reshape(c.B, c.T, H, E).transpose(1, 2)
    do = do.contiguous()
    backend = contextlib.nullcontext()
    if c.bf16:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = sdpa_kernel([SDPBackend.FLASH_ATTENTION])

    def ms(fn) -> float:
        """As gpu_timing.timed: CALLS calls a round, behind torch's own spin of ~20 ms."""
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            torch.cuda._sleep(40_000_000)  # cycles: ~20 ms at the H200's 1.98 GHz
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(CALLS):
                fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / CALLS)
        return float(np.median(times))

    kw = dict(enable_gqa=True) if gqa else {}
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)  # noqa: E731
    with backend:
        f = ms(fwd)
        o = fwd()
        b = ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    err = {}
    ref = next((r for key, r in REFERENCES.items() if key[:5] == tuple(shape.values())), None)
    if ref is not None:  # out of its first batch elements against the float64 reference
        nb = ref[0].shape[0]
        got = o[:nb].detach().float().transpose(1, 2).reshape(nb, c.T, H * E).cpu().numpy()
        err = dict(out=float(np.abs(got - ref[0]).max()), out_scale=float(np.abs(ref[0]).max()))
    what = "bf16, flash backend" if c.bf16 else "fp32"
    how = "enable_gqa" if gqa else "k, v repeated"
    emit(out, kind="time", impl=f"torch {torch.__version__} sdpa {what} ({how})", fwd_ms=f,
         bwd_ms=b, bwd_over_fwd=b / f, fwd_tflops=useful / f / 1e9,
         bwd_tflops=2.5 * useful / b / 1e9, **err, **shape)  # fmt: skip


def registers(out: Path | None, bf16: bool = False, **tag) -> None:
    """Registers per thread of each attention_tc kernel built for E = 64 (bf16's, if bf16)."""
    regs = guarded(out, "registers", **tag)(
        lambda: {
            k.py_func.__name__: [o.regs_per_thread for o in k.overloads.values()]
            for k in attention_tc.kernels(attention_tc.TcOptions(64, bf16=bf16))
        }
    )
    if regs:
        emit(out, kind="registers", **tag, **regs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="512,2048", help="sequence lengths of the big cases")
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-exact", action="store_true", help="skip the exact fp32 kernels")
    ap.add_argument("--no-small", action="store_true", help="skip the small correctness cases")
    ap.add_argument("--precision", choices=("tf32", "bf16"), default="tf32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    bf16 = args.precision == "bf16"
    exact = not args.no_exact and not bf16  # the exact kernels are fp32's
    dev = cuda.get_current_device()
    emit(args.out, kind="device", name=str(dev.name), cc=list(dev.compute_capability),
         precision=args.precision, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         command=" ".join(sys.argv))  # fmt: skip
    Ts = [int(t) for t in args.T.split(",")]
    # TF32: tail tiles (T not a multiple of 64), both head sizes, groups; bf16: whole tiles
    small = ((2, 128, 4, 2, 64), (2, 192, 4, 1, 32), (1, 64, 2, 2, 16)) if bf16 else (
        (2, 100, 4, 2, 64), (2, 131, 4, 1, 32), (1, 64, 2, 2, 64))  # fmt: skip
    tag = dict(precision=args.precision)
    if not args.no_small:
        for B, T, H, G, E in small:
            c = guarded(args.out, "setup", T=T, E=E)(lambda: Case(B, T, H, G, E, bf16=bf16))  # noqa: B023
            if c:
                check(c, args.out, exact, None, **tag)
    for T in Ts:
        c = guarded(args.out, "setup", T=T)(lambda: Case(args.batch, T, 12, 4, 64, bf16=bf16))  # noqa: B023
        if c is None:
            continue
        check(c, args.out, exact, ref_batch=1, **tag)
        time_case(c, args.out, args.reps, exact, more=True, **tag)
        registers(args.out, bf16=bf16, **tag)
        del c


if __name__ == "__main__":
    main()
