"""`euler bench` from the command line: a tiny run's JSON, and one-line errors for bad flags."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from euler.bench import peer as bench_peer
from euler.bench.kernels import layer_cases
from euler.cpu.backend import CpuBackend
from euler.model.config import get_preset
from tests.train_helpers import run_cli

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_tiny_run_writes_json_with_every_section(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.json"
    args = ["bench", "--preset", "tiny", "--steps", "2", "--no-compile", "--json", str(out)]
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "MFU = 6 * params * tokens/s / peak" in stdout and "training step" in stdout
    res = json.loads(out.read_text())
    assert set(res) == {"meta", "peak", "step", "layers", "attention", "tokenizer", "notes"}
    meta = res["meta"]
    assert (meta["preset"], meta["batch"], meta["seq"]) == ("tiny", 4, 24)
    assert len(meta["loadavg_before"]) == 3 and len(meta["loadavg_after"]) == 3
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
        (["--preset", "tiny", "--seq", "25"], ["--seq", "context"]),
        (["--batch", "0"], ["--batch"]),
        (["--steps", "0"], ["--steps"]),
        (["--warmup", "-1"], ["--warmup"]),
        (["--peak", "-1"], ["--peak"]),
        (["--json", "/nonexistent/folder/b.json"], ["--json", "/nonexistent/folder"]),
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
    """A round is `calls` calls and one sync, reported per call: on a GPU the launches then
    queue ahead of the device instead of each waiting for the last (GPU_CALLS there)."""
    from euler.bench import timing as bench_timing
    from euler.bench.kernels import GPU_CALLS, calls_for

    clock = iter(range(0, 1000, 6))  # each round takes 6 "seconds"
    monkeypatch.setattr(bench_timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    log = []
    ms = bench_timing.best_ms(lambda: log.append("call"), lambda: log.append("sync"), 2, calls=3)
    assert ms == 1e3 * 6 / 3
    assert log == ["call", "sync"] + ["call"] * 3 + ["sync"] + ["call"] * 3 + ["sync"]
    assert calls_for(CpuBackend()) == 1 and GPU_CALLS > 1
