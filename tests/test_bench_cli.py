"""`euler bench` from the command line: a tiny run's JSON, and one-line errors for bad flags."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from euler.bench import peer as bench_peer
from euler.bench import steps as bench_steps
from euler.bench.kernels import layer_cases
from euler.blas_kernels import core_name
from euler.cpu.backend import CpuBackend
from euler.errors import EulerError
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.config import TrainConfig
from euler.training.optim import AdamW
from tests.train_helpers import run_cli

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_tiny_run_writes_json_with_every_section(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.json"
    args = ["bench", "--preset", "tiny", "--steps", "2", "--no-compile", "--json", str(out)]
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "MFU = 6 * params * tokens/s / peak" in stdout and "training step" in stdout
    res = json.loads(out.read_text())
    assert set(res) == {"report", "meta", "peak", "step", "layers", "attention", "tokenizer",
                        "notes"}  # fmt: skip
    meta = res["meta"]
    assert (meta["preset"], meta["batch"], meta["seq"]) == ("tiny", 4, 24)
    assert len(meta["loadavg_before"]) == 3 and len(meta["loadavg_after"]) == 3
    assert meta["openblas_kernels"] == core_name()  # the family its products ran on
    assert f"OpenBLAS {core_name()} kernels" in " ".join(stdout.split())
    assert res["peak"]["gflop_per_s"] > 0 and "measured" in res["peak"]["source"]

    engines = {"ours", "torch_eager", "torch_compiled"} if HAS_TORCH else {"ours"}
    assert set(res["step"]) == engines
    for name in engines - {"torch_compiled"}:
        s = res["step"][name]
        assert s["steps_timed"] == 2 and s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1, name
        assert s["peak_memory_mib"] > 0
    if HAS_TORCH:
        assert res["step"]["torch_compiled"] == {"skipped": "--no-compile"}
        assert "vs torch eager" in stdout
    tiny = get_preset("tiny")
    assert set(res["layers"]) == set(layer_cases(CpuBackend(), tiny, 1, 4))
    assert [a["T"] for a in res["attention"]] == [24, 96]
    assert all(a["max_abs_diff_out"] < 1e-4 for a in res["attention"])
    tok = res["tokenizer"]
    assert "skipped" in tok or tok["encode_mb_per_s_1_threads"] > 0


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--device", "tpu"], ["--device", "tpu"]),
        (["--preset", "huge"], ["--preset", "huge"]),
        (["--preset", "tiny", "--seq-len", "25"], ["--seq-len", "context"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--steps", "0"], ["--steps"]),
        (["--untimed-steps", "-1"], ["--untimed-steps"]),
        (["--peak", "-1"], ["--peak"]),
        (["--json", "/nonexistent/folder/b.json"], ["--json", "/nonexistent/folder"]),
        (["--precision", "tf32"], ["--precision tf32", "CPU", "fp32"]),
        (["--precision", "x"], ["--precision", "'x'", "fp32, tf32, bf16"]),
    ],
)
def test_bad_flags_give_one_line_errors(flags, words, monkeypatch, capsys):
    code, stdout, err = run_cli(monkeypatch, capsys, "bench", *flags)
    assert code == 2 and stdout == "", (code, stdout, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_cuda_without_a_gpu_is_one_line(monkeypatch, capsys):
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--device", "cuda", "--preset", "tiny")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


def test_the_package_never_imports_torch():
    """`euler bench` loads torch only inside run_bench, when it times the peer."""
    code = (
        "import sys, euler.bench.steps, euler.bench.report, euler.cli.main; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_peer_skipped_with_a_note_when_torch_is_missing(monkeypatch):
    real = bench_peer.importlib.util.find_spec
    monkeypatch.setattr(
        bench_peer.importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a)
    )
    peer, why = bench_peer.load_torch_peer()
    assert peer is None and "not installed" in why


def test_best_ms_times_rounds_of_calls_per_call(monkeypatch):
    """A round is `calls` calls and one sync, reported per call; the CPU's layers take one
    call a round (call_ms), a GPU's GPU_CALLS behind a spinning kernel."""
    from euler.bench import kernels as bench_kernels
    from euler.bench import timing as bench_timing

    clock = iter(range(0, 1000, 6))  # each round takes 6 "seconds"
    monkeypatch.setattr(bench_timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    log = []
    ms = bench_timing.best_ms(lambda: log.append("call"), lambda: log.append("sync"), 2, calls=3)
    assert ms == 1e3 * 6 / 3
    assert log == ["call", "sync"] + ["call"] * 3 + ["sync"] + ["call"] * 3 + ["sync"]
    log.clear()
    monkeypatch.setattr(bench_kernels, "best_ms", bench_timing.best_ms)
    bench_kernels.call_ms(CpuBackend(), lambda: log.append("call"), 2)
    assert log == ["call"] * 3 and bench_kernels.GPU_CALLS > 1


# ------------------------------------------------------------------ --precision


# the peer's run (a process importing torch, CPU bf16 autocast) takes 16 s of the 8 minutes
@pytest.mark.parametrize(
    "peer", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["no_peer", "peer"]
)
def test_tiny_bf16_run(peer, tmp_path, monkeypatch, capsys):
    """Both engines in bf16: ours in the CPU's bf16 emulation, the peer (when torch is here)
    in CPU bf16 autocast; from the same weights and batch their last losses agree to bf16's
    rounding. Attention's output is stored in bf16: it differs from the naive float32 one
    by bf16 steps, not float32's."""
    if peer and not HAS_TORCH:
        pytest.skip("torch is not installed")
    # the tokenizer's training (about 30 s here) is the same in every precision
    monkeypatch.setattr(bench_steps, "tokenizer_speed", lambda: {"skipped": "not here"})
    out = tmp_path / "bench.json"
    args = ["bench", "--device", "cpu", "--preset", "tiny", "--precision", "bf16"]
    args += [
        "--steps",
        "1",
        "--untimed-steps",
        "0",
        "--peak",
        "1",
        "--no-compile",
        "--json",
        str(out),
    ]
    code, stdout, err = run_cli(monkeypatch, capsys, *args, *([] if peer else ["--no-peer"]))
    assert code == 0, err
    assert "cpu, bf16" in stdout and "layer kernels alone, bf16" in stdout
    res = json.loads(out.read_text())
    assert res["meta"]["precision"] == res["meta"]["options"]["precision"] == "bf16"
    ours = res["step"]["ours"]
    assert ours["precision"] == "bf16" and math.isfinite(ours["loss_last"])
    assert any("emulation" in n for n in res["notes"])
    assert set(res["layers"]) == set(layer_cases(CpuBackend(), get_preset("tiny"), 1, 4, "bf16"))
    assert all(1e-4 < a["max_abs_diff_out"] < 3e-2 for a in res["attention"])
    if peer:
        torch_eager = res["step"]["torch_eager"]
        assert torch_eager["precision"] == "bf16 autocast", torch_eager
        assert abs(torch_eager["loss_last"] / ours["loss_last"] - 1) < 0.02
    else:
        assert set(res["step"]) == {"ours"}


def test_precision_defaults_and_refusals_as_train_resolves_them():
    assert bench_steps.BenchOptions(device="cpu").precision == "fp32"
    assert bench_steps.BenchOptions(device="cuda").precision == "tf32"
    for bad in ("tf32", "fp16"):
        with pytest.raises(EulerError) as ours:
            bench_steps.BenchOptions(device="cpu", precision=bad).resolve()
        with pytest.raises(EulerError) as train:
            TrainConfig(device="cpu", precision=bad)
        # the same words, from euler.precision.ACCEPTED, where only the command differs
        assert str(ours.value) == str(train.value).replace("euler train", "euler bench")


class DtypeRecorder:
    """A backend that records, per method called, each argument's dtype (None: not an
    array; the arrays of matmul_pair's products one by one), then runs the CPU's method."""

    def __init__(self):
        self.be = CpuBackend()
        self.calls: dict[str, set[tuple]] = {}

    def __getattr__(self, name):
        fn = getattr(self.be, name)
        if not callable(fn) or name in ("zeros", "to_device", "to_host", "stage_scalars"):
            return fn

        def recorded(*args, **kwargs):
            bound = inspect.signature(fn).bind(*args, **kwargs)
            bound.apply_defaults()
            flat = [
                x for v in bound.arguments.values() for x in (v if name == "matmul_pair" else [v])
            ]
            sig = tuple(str(x.dtype) if isinstance(x, np.ndarray) else None for x in flat)
            self.calls.setdefault(name, set()).add(sig)
            return fn(*args, **kwargs)

        return recorded


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layer_cases_pass_the_dtypes_the_model_passes(precision):
    """Each layer case calls its method with argument dtypes that one training step of the
    model (forward, backward, AdamW) in the same precision passes it."""
    cfg = get_preset("tiny")
    model_be, cases_be = DtypeRecorder(), DtypeRecorder()
    model = Model(cfg, backend=model_be, seed=0, precision=precision)
    model.forward(*bench_steps.synthetic_batch(cfg, 1, 4), need_grad=True)
    model.backward()
    AdamW(model).step(1e-3)
    for fn in layer_cases(cases_be, cfg, 1, 4, precision).values():
        fn()
    generation_only = {"residual_forward"}  # training adds residuals inside the products
    assert set(cases_be.calls) - generation_only <= set(model_be.calls)
    for name, sigs in cases_be.calls.items():
        if name not in generation_only:
            assert sigs <= model_be.calls[name], (name, sigs, model_be.calls[name])
    assert any("uint16" in str(s) for s in cases_be.calls.values()) == (precision == "bf16")


def test_peak_in_bf16_multiplies_bf16_operands():
    """On the GPU the peak is a bf16 product (uint16 bits in, out) labelled as one."""
    seen = []
    fake = SimpleNamespace(
        to_device=lambda a: a, zeros=np.zeros, synchronize=lambda: None,
        matmul=lambda c, a, b: seen.append((c.dtype, a.dtype, b.dtype)),
    )  # fmt: skip
    peak = bench_steps.measure_peak(fake, "cuda", "bf16", n=8)
    assert set(seen) == {(np.dtype(np.uint16),) * 3} and "bf16" in peak["source"]
    seen.clear()
    assert "TF32" in bench_steps.measure_peak(fake, "cuda", "tf32", n=8)["source"]
    assert set(seen) == {(np.dtype(np.float32),) * 3}


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_peer_precision_settings():
    """fp32: exact float32 matmuls; tf32 on a GPU: TF32; bf16: products in autocast bf16."""
    import torch

    try:
        assert bench_peer.set_precision("fp32", "cuda") is not None
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cuda.matmul.allow_tf32
        bench_peer.set_precision("tf32", "cuda")
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32
        with bench_peer.set_precision("bf16", "cpu"):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        assert torch.get_float32_matmul_precision() == "highest"  # exact on the CPU
        with bench_peer.set_precision("fp32", "cpu"):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    finally:
        bench_peer.set_precision("fp32", "cpu")  # torch's defaults, for the tests after
