"""`euler bench`: our engine against the PyTorch peer on the same shapes, in one run.

Measures, on one device (CPU or CUDA):
- the full training step (forward, backward, clip, AdamW) of our engine and of the PyTorch
  peer (euler.bench.torch_peer: eager, and compiled by torch.compile where that works):
  tokens/s, ms per step, MFU and peak memory, both in one --precision (fp32, tf32 or bf16;
  euler.bench.peer says how the peer runs each);
- in euler.bench.kernels: each layer kernel's forward and backward alone; our attention
  (FlashAttention, or on the CPU up to T = 256 dense score blocks) against a naive
  attention that materialises the (T, T) scores; tokenizer
  encode MB/s, on a tokenizer trained here on the embedded corpus text.

The package never imports torch at module level: euler.bench.peer imports the peer lazily,
and only when torch is importable; otherwise the peer is skipped with a note. The peer's
steps run in a fresh process of their own, as PyTorch would run alone. Both engines start from the
same weights and run the same steps on the same batch, so their last losses agree. Times
are wall-clock seconds around synchronised calls; a step's figure is the median of the
timed steps.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numba
import numpy as np

from euler.backend import make_backend
from euler.bench.kernels import attention_batch, compare_attention, time_layers, tokenizer_speed
from euler.bench.peer import LR, load_torch_peer, time_peer_in_own_process
from euler.bench.timing import StepTurns, best_ms, peak_rss_mib, reset_peak_rss, time_steps
from euler.errors import EulerError
from euler.model.config import ModelConfig, get_preset
from euler.model.transformer import Model, make_targets
from euler.precision import DEVICES, check_bf16_sequence, resolve_precision, to_bf16
from euler.schema import check_number
from euler.training import step_graph
from euler.training.optim import AdamW

# (batch, seq) per preset when --batch-size / --seq-len are not given
DEFAULT_SHAPES = {"tiny": (4, 24), "small": (16, 128), "gpu": (32, 512)}
MFU_FORMULA = "MFU = 6 * params * tokens/s / peak"


@dataclass(frozen=True)
class BenchOptions:
    """What `euler bench` runs. batch/seq None: the preset's DEFAULT_SHAPES."""

    device: str = "cpu"  # "cpu" or "cuda"
    preset: str = "small"
    batch: int | None = None
    seq: int | None = None
    steps: int = 5  # timed training steps per engine, after `warmup` untimed ones
    warmup: int = 1
    peer: bool = True  # also time the PyTorch peer when torch is importable
    compile: bool = True  # also time torch.compile(peer) (slow to compile on CPU)
    peak_tflops: float | None = None  # None: measure a large matmul on the spot
    reps: int = 5  # repetitions per layer / attention timing (the minimum is kept)
    precision: str | None = None  # None: euler.precision.ACCEPTED's default for bench

    def __post_init__(self) -> None:
        # frozen: the resolved default is set once, here, so that the JSON's options hold it
        if self.precision is None and self.device in DEVICES:  # else resolve() says why
            object.__setattr__(self, "precision", resolve_precision(self.device, None, "bench"))

    def resolve(self) -> tuple[ModelConfig, int, int]:
        """(config, B, T), or EulerError naming the bad flag."""
        if self.device not in ("cpu", "cuda"):
            raise EulerError(f"--device: expected cpu or cuda, got {self.device!r}")
        resolve_precision(self.device, self.precision, "bench")
        cfg = get_preset(self.preset)
        B0, T0 = DEFAULT_SHAPES.get(self.preset, (8, cfg.context))
        B = B0 if self.batch is None else self.batch
        T = T0 if self.seq is None else self.seq
        for flag, value in (("--batch-size", B), ("--seq-len", T), ("--steps", self.steps)):
            if value < 1:
                raise EulerError(f"{flag} must be at least 1, got {value}")
        if self.warmup < 0:
            raise EulerError(f"--untimed-steps must be 0 or more, got {self.warmup}")
        if self.reps < 1:
            raise EulerError(f"reps must be at least 1, got {self.reps}")
        if self.peak_tflops is not None:
            check_number(self.peak_tflops, "--peak (TFLOP/s)", lo=0.0, lo_open=True)
        if T > cfg.context:
            raise EulerError(
                f"--seq-len {T} exceeds the {self.preset} preset's context ({cfg.context})"
            )
        check_bf16_sequence(self.device, self.precision, T, "--seq-len")
        return cfg, B, T


@dataclass
class BenchResult:
    """Everything one run measured; `to_dict()` is the JSON written by --json."""

    meta: dict
    peak: dict
    step: dict  # engine name -> stats, or {"skipped": why}
    layers: dict  # kernel case -> ms
    attention: list
    tokenizer: dict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ devices and timing


def git_commit() -> str | None:
    """HEAD of the checkout the package runs from (with "+dirty" if files differ), or None."""
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", *a], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
        head = run("rev-parse", "HEAD")
        if head.returncode:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


# what measure_peak multiplies on the GPU in each precision, as its `source` names it
GPU_PEAK_PRODUCT = {
    "fp32": "cuBLAS fp32 matmul (exact; our backend)",
    "tf32": "cuBLAS TF32 matmul (our backend)",
    "bf16": "cuBLASLt bf16 matmul (bf16 operands and output, fp32 accumulation; our backend)",
}


def measure_peak(be, device: str, precision: str, n: int | None = None) -> dict:
    """Dense matmul GFLOP/s measured now: the MFU denominator unless --peak is given.

    CPU: NumPy's float32 sgemm at n^3 = 2048^3 on every BLAS thread, in every precision (the
    CPU has no bf16 product; its bf16 emulation multiplies in float32). CUDA: our backend's
    product at 8192^3 in the step's precision (GPU_PEAK_PRODUCT): under bf16, uint16 bf16
    operands and output, as the model's products take them.
    """
    n = n or (2048 if device == "cpu" else 8192)
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    lowp = device == "cuda" and precision == "bf16"
    a = be.to_device(to_bf16(a) if lowp else a)
    c = be.zeros((n, n), a.dtype)
    ms = best_ms(lambda: be.matmul(c, a, a), be.synchronize, 3)
    if device == "cuda":
        what = GPU_PEAK_PRODUCT[precision]
    elif precision == "bf16":
        what = "numpy float32 matmul (the CPU has no bf16 product; its emulation runs fp32's)"
    else:
        what = "numpy float32 matmul"
    return {
        "gflop_per_s": 2 * n**3 / ms / 1e6,
        "source": f"measured now: {what} {n}^3, best of 3",
    }


# ------------------------------------------------------------------ our training step


def synthetic_batch(cfg: ModelConfig, B: int, T: int, seed: int = 0):
    """tokens (B, T) and targets (K, B, T) from one fixed random window (no data loading)."""
    window = np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, T + cfg.n_mtp))
    return window[:, :T], make_targets(window, T, cfg.n_mtp)


def time_engine(
    cfg: ModelConfig, be, device: str, tokens, targets, steps: int, warmup: int,
    graph: bool = False, precision: str = "fp32", turns: StepTurns | None = None,
) -> dict:  # fmt: skip
    """Our training step (forward, backward, clip, AdamW) on tokens (B, T), targets
    (K, B, T) in `precision` (be made for it by make_backend), as the trainer runs it (with
    graph=True, replayed as CUDA graphs on a GPU): time_steps' statistics plus memory; each
    step in its turn where turns are given (bench/cpu_lockstep.py)."""
    rss0 = reset_peak_rss() if device == "cpu" else None
    if device == "cuda":
        be.release_unused()  # an earlier engine's buffers must not count in this one's memory
    model = Model(cfg, backend=be, dtype=np.float32, seed=0, precision=precision)
    opt = AdamW(model)
    graphs = step_graph.StepGraphs(be, enabled=graph)

    def step() -> float:
        model.stage(tokens, targets)
        loss = step_graph.forward_backward(graphs, model)
        step_graph.update(graphs, opt, LR)
        return loss

    stats = time_steps(step, be.synchronize, steps, warmup, turns)  # the first compiles
    stats["cuda_graph_nodes"] = graphs.nodes()
    stats["precision"] = precision
    graphs.close()
    if device == "cpu":
        stats["peak_memory_mib"] = peak_rss_mib()
        stats["rss_at_start_mib"] = rss0
        stats["memory_kind"] = "peak RSS of the process during this engine's run"
    else:
        stats["peak_memory_mib"] = be.peak_memory()[0] / 2**20
        stats["memory_kind"] = "device memory in use after the steps (driver)"
    return stats


# ------------------------------------------------------------------ the run


def run_bench(opts: BenchOptions, log: Callable[[str], None] = print) -> BenchResult:
    """Run every measurement of `opts`; `log` hears one line per phase (progress)."""
    cfg, B, T = opts.resolve()
    precision = opts.precision
    be = make_backend(opts.device, precision)  # the peer runs in the same precision
    notes: list[str] = []
    if opts.device == "cpu" and precision == "bf16":
        notes.append(
            "bf16 on the CPU is the emulation (euler.cpu.backend: each bf16 argument widened "
            "to a float32 copy, each bf16 output rounded back): it checks numerics, and its "
            "times are not a bf16 engine's"
        )
    load_before = os.getloadavg()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["euler", *sys.argv[1:]]),
        "git_commit": git_commit(),
        "options": asdict(opts),
        "preset": opts.preset,
        "config": cfg.to_dict(),
        "params": cfg.n_params(),
        "batch": B,
        "seq": T,
        "tokens_per_step": B * T,
        "device": opts.device,
        "precision": precision,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }
    if opts.device == "cpu":  # OpenBLAS's kernel family sets our products' speed
        from euler.blas_kernels import core_name

        meta["openblas_kernels"] = core_name()
    if opts.device == "cuda":  # the hardware a GPU run's figures belong to
        from numba import cuda

        gpu = cuda.get_current_device()
        name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
        meta["gpu"] = f"{name}, compute capability {'.'.join(map(str, gpu.compute_capability))}"
    log("peak: measuring a large matmul")
    if opts.peak_tflops is None:
        peak = measure_peak(be, opts.device, precision)
    else:
        peak = {"gflop_per_s": opts.peak_tflops * 1e3, "source": "given by --peak"}
    peak["mfu_formula"] = MFU_FORMULA

    tokens, targets = synthetic_batch(cfg, B, T)
    threads = numba.get_num_threads()  # the peer gets as many threads as our prange kernels
    step: dict[str, dict] = {}
    log(f"ours: {opts.warmup + 1} untimed + {opts.steps} timed steps at B={B} T={T}")
    ours = (cfg, be, opts.device, tokens, targets, opts.steps, opts.warmup)
    step["ours"] = time_engine(*ours, precision=precision)
    if opts.device == "cuda":
        log("ours with CUDA graphs: each step's kernels captured once, then replayed")
        step["ours_cuda_graph"] = time_engine(*ours, graph=True, precision=precision)
    peer, why = load_torch_peer() if opts.peer else (None, "--no-peer")
    if peer is None:
        notes.append(f"PyTorch peer skipped: {why}")
    else:
        import torch

        meta["torch"] = torch.__version__
        args = (cfg, opts.device, tokens, targets, opts.steps, opts.warmup, threads, precision)
        log("torch_eager: the same steps, in its own process")
        step["torch_eager"] = time_peer_in_own_process(*args, compiled=False)
        if opts.compile:
            log("torch_compiled: the same steps (the first one compiles), in its own process")
            step["torch_compiled"] = time_peer_in_own_process(*args, compiled=True)
        else:
            step["torch_compiled"] = {"skipped": "--no-compile"}
    for name, s in step.items():
        if "ms_per_step" in s:
            s["tokens_per_s"] = B * T / (s["ms_per_step"] / 1e3)
            s["mfu"] = 6 * cfg.n_params() * s["tokens_per_s"] / (peak["gflop_per_s"] * 1e9)
        else:
            notes.append(f"{name}: {s['skipped']}")

    log("layers: each kernel alone")
    layers = time_layers(be, cfg, B, T, opts.reps, precision)
    on_gpu = opts.device == "cuda"
    log(f"attention: ours against naive attention ({'cuBLAS' if on_gpu else 'NumPy'})")
    attention = [
        compare_attention(be, cfg, attention_batch(cfg, B, t), t, opts.reps, on_gpu, precision)
        for t in (T, 4 * T)
    ]
    log("tokenizer: training on pydoc_data.topics, then encoding it")
    tokenizer = tokenizer_speed()
    meta["loadavg_before"] = list(load_before)
    meta["loadavg_after"] = list(os.getloadavg())
    return BenchResult(meta, peak, step, layers, attention, tokenizer, notes)
