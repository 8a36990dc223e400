"""GPU benchmark: the `gpu` preset's training step, per-layer times, FlashAttention vs naive.

    python bench/bench_gpu.py --out bench/results/gpu-DATE-h200.json
    python bench/bench_gpu.py --profile-only --precision bf16 --out FILE   # the profile alone

Measures on the current CUDA GPU in `--precision` (tf32 by default, as training runs; fp32
exact; bf16 with the model's bf16 tensors, euler.precision.BF16_TENSORS):
- the trainer's step at the defaults and with one of them off each: the weight gradients
  in line instead of on a side stream (GpuBackend(overlap=False)), without token-contiguous
  copies of an operand (GpuOptions.transpose_weight_grads), without the residual adds fused
  into the output projections (GpuOptions.fused_residual), and with copies only next to a
  2048-wide side (GpuOptions.transpose_min_width 2048), and with each cuBLASLt product on
  the heuristic's first algorithm (GpuOptions.gemm_candidates 1), replayed as CUDA graphs
  and launched (`--steps-only`: just this; --knobs, --rounds and --graph-only make an A/B in turn:
  `--knobs default first_algorithm --rounds 2 --graph-only --steps 20`);
- the training step (forward, backward, clipping and AdamW) at batch B x T: tokens/s, model
  FLOPs utilisation against `--peak` TFLOP/s at `--flop-per-token`, the host (Python) time
  per step, and device memory in use;
- time per backend method over one step, from CUDA events around each call, twice: as the
  step is launched (the host's launch gaps fall between the events) and with the whole
  step queued behind a busy kernel first ("device only": the device then runs it back to
  back, so each method's events hold its kernels' time alone);
- each distinct matrix product of the step (shape, transposes) alone: ms, TFLOP/s, and
  how many a step makes;
- our FlashAttention forward and backward against a naive attention that materialises the
  (B H, T, T) scores (batched cuBLAS GEMMs and a row softmax kernel) at each `--attn-t`.

`--profile-only` measures just the training step's rows: its tokens/s, the per-method
profile (launched and device only) and the products alone, in a minute or so.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import gpu_timing  # noqa: E402
from euler.gpu import attention  # noqa: E402
from euler.gpu.backend import GpuBackend  # noqa: E402
from euler.gpu.naive_attention import NaiveAttention  # noqa: E402
from euler.gpu.options import GpuOptions  # noqa: E402
from euler.model.config import PRESETS  # noqa: E402
from euler.model.transformer import Model, make_targets  # noqa: E402
from euler.precision import PRECISIONS, storage_dtype  # noqa: E402

# dense TFLOP/s of an H200's products in each precision (datasheet): --peak's default
H200_PEAK_TFLOPS = {"fp32": 67.0, "tf32": 495.0, "bf16": 990.0}


class Hyper:
    grad_clip, beta1, beta2, eps, weight_decay = 1.0, 0.9, 0.95, 1e-8, 0.1


def timed(be: GpuBackend, fn, reps: int) -> float:
    """Median device ms of fn() on the backend's stream (gpu_timing.timed)."""
    return gpu_timing.timed(be.stream, fn, reps)


class TimedBackend:
    """Wraps a backend; records CUDA events around each layer method to sum time per name."""

    LAYER = ("matmul", "embedding_", "rmsnorm_", "rope_", "attention_", "swiglu_", "residual_")

    def __init__(self, be: GpuBackend):
        self.be = be
        self.events: list[tuple[str, object, object]] = []
        # (M, N, K, trans_a, trans_b, accumulate) -> [count, arguments of its first call]
        self.gemms: dict[tuple, list] = {}

    def __getattr__(self, name):
        fn = getattr(self.be, name)
        if not name.startswith(self.LAYER + ("cross_entropy", "loss_value", "adamw")):
            return fn

        def wrapper(*args, **kw):
            if name == "matmul":
                self._count_gemm(*args, **kw)
            elif name == "matmul_residual":  # out = res + a b^T: count its product a b^T
                dst, _, a, b = args
                self._count_gemm(dst, a, b, False, True)
            start, stop = cuda.event(), cuda.event()
            start.record(self.be.stream)
            out = fn(*args, **kw)
            stop.record(self.be.stream)
            self.events.append((name, start, stop))
            return out

        return wrapper

    def matmul_pair(self, first, second) -> None:
        """Both products in line on the main stream, each timed and counted as a matmul."""
        for args in (first, second):
            self.matmul(*args)

    def _count_gemm(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        entry = self.gemms.setdefault((M, N, K, trans_a, trans_b, accumulate), [0, None])
        entry[0] += 1
        entry[1] = (out, a, b, trans_a, trans_b, accumulate)

    def totals(self) -> dict[str, float]:
        self.be.synchronize()
        out: dict[str, float] = defaultdict(float)
        for name, a, b in self.events:
            out[name] += cuda.event_elapsed_time(a, b)
        self.events.clear()
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def gemm_table(be: GpuBackend, gemms: dict, steps: int, reps: int) -> list[dict]:
    """Each distinct product of `steps` recorded steps alone (on its own arrays): median ms,
    TFLOP/s, calls per step, and ms per step; slowest total first."""
    rows = []
    for (M, N, K, ta, tb, acc), (count, args) in gemms.items():
        ms = timed(be, lambda args=args: be.matmul(*args), reps)
        rows.append(dict(M=M, N=N, K=K, trans_a=ta, trans_b=tb, accumulate=acc,
                         per_step=count / steps, ms=ms, tflops=2 * M * N * K / ms / 1e9,
                         ms_per_step=ms * count / steps))  # fmt: skip
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def train_step(model: Model, tokens, targets, state, step: int):
    loss = model.forward(tokens, targets, need_grad=True)
    model.backward()
    m, v = state
    hyper = model.be.stage_scalars("adamw", [3e-4, 1 - Hyper.beta1**step, 1 - Hyper.beta2**step])
    model.be.adamw_step(
        model.params, model.grads, m, v, Hyper, hyper, model.layout.n_decay, lowp=model.params_lp
    )
    return loss


def bench_step(args) -> dict:
    cfg = PRESETS[args.preset]
    be = GpuBackend(tf32=args.precision != "fp32")
    B, T = args.batch, args.seq
    rng = np.random.default_rng(0)
    window = rng.integers(0, cfg.vocab_size, (B, T + cfg.n_mtp))
    tokens, targets = window[:, :T], make_targets(window, T, cfg.n_mtp)
    timer = TimedBackend(be)
    model = Model(cfg, backend=timer, dtype=np.float32, precision=args.precision)
    state = [be.zeros((model.layout.size,), np.float32) for _ in range(2)]
    t0 = time.perf_counter()
    loss0 = float(train_step(model, tokens, targets, state, 1))  # compiles every kernel
    compile_s = time.perf_counter() - t0
    timer.totals()
    timer.gemms.clear()
    train_step(model, tokens, targets, state, 2)
    per_method = timer.totals()
    held = gpu_timing.hold_stream(be.stream, 1000.0)  # the host queues the step while this runs
    h0 = time.perf_counter()
    train_step(model, tokens, targets, state, 3)
    queued_ms = (time.perf_counter() - h0) * 1e3
    per_method_device = timer.totals()
    gemms = gemm_table(be, timer.gemms, 2, args.reps)
    model.be = be  # untimed from here on
    be.synchronize()
    host, steps = [], args.steps
    t0 = time.perf_counter()
    for s in range(steps):
        h0 = time.perf_counter()
        loss = train_step(model, tokens, targets, state, 3 + s)
        host.append(time.perf_counter() - h0)
    be.synchronize()
    wall = (time.perf_counter() - t0) / steps
    used, total = be.peak_memory()
    tok_s = B * T / wall
    return {
        "preset": args.preset,
        "batch": B,
        "seq_len": T,
        "params": model.layout.size,
        "precision": args.precision,
        "steps_timed": steps,
        "step_ms": wall * 1e3,
        "host_ms_per_step": float(np.median(host)) * 1e3,
        "tokens_per_s": tok_s,
        "mfu": tok_s * args.flop_per_token / (args.peak * 1e12),
        "first_step_s_incl_compile": compile_s,
        "loss_first": loss0,
        "loss_last": float(loss),
        "device_mem_in_use_gib": used / 2**30,
        "device_mem_total_gib": total / 2**30,
        "per_method_ms_one_step": per_method,
        "per_method_device_only_ms": per_method_device,
        "device_only_sum_ms": sum(per_method_device.values()),
        # the device-only times hold if the host queued the whole step before the hold ended
        "device_only_queued_ms": queued_ms,
        "device_only_hold_ms": held,
        "device_only_clean": queued_ms < 0.9 * held,
        "gemms_alone": gemms,
        "gemms_alone_ms_per_step": sum(r["ms_per_step"] for r in gemms),
    }


def overlap_steps(args) -> dict[str, dict]:
    """The trainer's step (euler.bench.steps.time_engine) at the defaults, then with one
    default off each: the weight gradients in line (no side stream), without
    token-contiguous copies (GpuOptions.transpose_weight_grads), without the output
    projections' residual adds fused into their GEMMs (GpuOptions.fused_residual:
    cuBLASLt); with token-contiguous copies only where the other side is 2048 or more wide
    (GpuOptions.transpose_min_width 2048); with each cuBLASLt product on the
    heuristic's first algorithm, not the fastest of 8 (GpuOptions.gemm_candidates 1); each
    replayed as CUDA graphs and
    launched: time_steps' statistics plus tokens/s. --knobs keeps the named rows, --rounds
    repeats them in turn (A B A B: rows named name_graph_r1, ...), --graph-only skips the
    launched steps: an A/B of two knobs in one call."""
    from euler.bench.steps import synthetic_batch, time_engine

    cfg = PRESETS[args.preset]
    tokens, targets = synthetic_batch(cfg, args.batch, args.seq)
    rows = {}
    knobs = (
        ("default", True, GpuOptions()),
        ("in_line", False, GpuOptions()),
        ("untransposed", True, GpuOptions(transpose_weight_grads=False)),
        ("unfused_residual", True, GpuOptions(fused_residual=False)),
        ("wide_transposed", True, GpuOptions(transpose_min_width=2048)),
        ("first_algorithm", True, GpuOptions(gemm_candidates=1)),
    )
    names = [k[0] for k in knobs]
    unknown = sorted(set(args.knobs or ()) - set(names))
    if unknown:
        raise SystemExit(f"--knobs: {', '.join(unknown)} not among {', '.join(names)}")
    picked = [k for k in knobs if not args.knobs or k[0] in args.knobs]
    for r in range(args.rounds):
        for name, overlap, options in picked:
            be = GpuBackend(tf32=args.precision != "fp32", overlap=overlap, options=options)
            for graph in (True,) if args.graph_only else (True, False):
                s = time_engine(
                    cfg, be, "cuda", tokens, targets, args.steps, 2, graph=graph,
                    precision=args.precision,
                )  # fmt: skip
                s["tokens_per_s"] = args.batch * args.seq / s["ms_per_step"] * 1e3
                row = f"{name}_{'graph' if graph else 'launched'}"
                row += f"_r{r + 1}" if args.rounds > 1 else ""
                print(row, json.dumps(s), flush=True)
                rows[row] = s
            del be
    return rows


def bench_attention(be: GpuBackend, T: int, args) -> dict:
    """FlashAttention vs naive (materialised scores), forward and backward, at length T, in
    the model's dtypes under --precision (bf16: qkv, dout and out bf16; the naive one reads
    the same values in float32)."""
    from euler.bench.kernels import stored
    from euler.precision import as_float32

    B, H, G, E = args.batch, 12, 4, 64
    rng = np.random.default_rng(T)
    qkv_s = stored(args.precision, "qkv", rng.standard_normal((B, T, (H + 2 * G) * E), np.float32))
    dout_s = stored(args.precision, "datt", rng.standard_normal((B, T, H * E), np.float32))
    qkv, dout = be.to_device(qkv_s), be.to_device(dout_s)
    qkv_h, dout_h = as_float32(qkv_s), as_float32(dout_s)
    dtype = lambda name: storage_dtype(args.precision, name)  # noqa: E731
    out, lse = be.zeros((B, T, H * E), dtype("att")), be.zeros((B, H, T), dtype("lse"))
    dqkv = be.zeros(qkv_h.shape, dtype("dqkv"))
    flash_fwd = timed(be, lambda: be.attention_forward(out, lse, qkv, H, G, E), args.reps)
    flash_bwd = timed(
        be, lambda: be.attention_backward(dqkv, dout, qkv, out, lse, H, G, E), args.reps
    )
    flash_out = as_float32(be.to_host(out))
    simple_fwd = simple_bwd = None  # bf16: the one-row-per-thread kernels are float32's
    if args.precision != "bf16":
        # the readable kernels (attention.py: --exact-attention, any head size)
        simple_fwd = timed(
            be, lambda: attention.attention_forward(out, lse, qkv, H, G, E, be.stream), args.reps
        )
        dsum = be.scratch("attention_dsum", lse.shape, lse.dtype)
        simple_bwd = timed(
            be,
            lambda: attention.attention_backward(
                dqkv, dout, qkv, out, lse, H, G, E, dsum, be.stream
            ),
            args.reps,
        )
    naive = NaiveAttention(be, qkv_h, dout_h, H, G, E)
    naive_f = timed(be, naive.forward, args.reps)
    naive_b = timed(be, naive.backward, args.reps)
    naive_out = naive.out()
    useful = 4 * B * H * T * T * E / 2  # causal forward FLOPs
    return {
        "precision": args.precision,
        "B": B,
        "T": T,
        "H": H,
        "G": G,
        "E": E,
        "flash_fwd_ms": flash_fwd,
        "flash_bwd_ms": flash_bwd,
        "flash_fwd_tflops": useful / flash_fwd / 1e9,
        "flash_bwd_over_fwd": flash_bwd / flash_fwd,
        "one_row_per_thread_fwd_ms": simple_fwd,
        "one_row_per_thread_bwd_ms": simple_bwd,
        "naive_fwd_ms": naive_f,
        "naive_bwd_ms": naive_b,
        "naive_tf32": be.blas.tf32,
        "naive_over_flash_fwd_bwd": (naive_f + naive_b) / (flash_fwd + flash_bwd),
        "max_abs_diff_flash_vs_naive": float(np.abs(flash_out - naive_out).max()),
    }


def kernel_resources(E: int = 64) -> list[dict]:
    """Registers and local (spilled) memory per thread of the readable attention kernels at
    head size E and their own tiles, as bench_attention compiled them."""
    from euler.gpu import attention

    kernels = attention.kernels(E, *attention.tiles(E))
    out = []
    for disp in kernels:
        for kern in disp.overloads.values():
            out.append(
                {
                    "kernel": disp.py_func.__name__,
                    "registers": kern.regs_per_thread,
                    "local_bytes": kern.local_mem_per_thread,
                    "static_shared_bytes": kern.shared_mem_per_block,
                }
            )
    return out


def device_name() -> str:
    try:
        q = "--query-gpu=name,driver_version,memory.total"
        return subprocess.check_output(["nvidia-smi", q, "--format=csv,noheader"], text=True)
    except (OSError, subprocess.CalledProcessError):
        return cuda.get_current_device().name.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--seq-len", dest="seq", metavar="T", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--attn-t", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--precision", choices=PRECISIONS, default="tf32")
    ap.add_argument(
        "--peak", type=float, default=None,
        help="dense TFLOP/s in --precision (default: the H200's, H200_PEAK_TFLOPS)",
    )  # fmt: skip
    ap.add_argument("--flop-per-token", type=float, default=0.72e9)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--steps-only", action="store_true", help="just the overlap_steps table")
    ap.add_argument("--knobs", nargs="*", default=None, help="--steps-only: these rows only")
    ap.add_argument("--rounds", type=int, default=1, help="--steps-only: rows repeated in turn")
    ap.add_argument("--graph-only", action="store_true", help="--steps-only: no launched steps")
    ap.add_argument(
        "--profile-only", action="store_true",
        help="just the training step: its per-method profile and the products alone",
    )  # fmt: skip
    args = ap.parse_args()
    args.peak = args.peak or H200_PEAK_TFLOPS[args.precision]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": device_name().strip(),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
    if not args.profile_only:
        result["steps"] = overlap_steps(args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        if args.steps_only:
            return
    result["train_step"] = bench_step(args)
    print(json.dumps(result["train_step"], indent=1), flush=True)
    if args.profile_only:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    be = GpuBackend(tf32=args.precision != "fp32")
    result["attention"] = [bench_attention(be, t, args) for t in args.attn_t]
    result["kernel_resources"] = kernel_resources()
    for r in result["attention"] + result["kernel_resources"]:
        print(json.dumps(r), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    ts = result["train_step"]
    print(
        f"{ts['tokens_per_s']:.0f} tokens/s, step {ts['step_ms']:.1f} ms "
        f"(host {ts['host_ms_per_step']:.1f} ms), MFU {100 * ts['mfu']:.1f}%"
    )


if __name__ == "__main__":
    main()
