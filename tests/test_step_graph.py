"""CUDA-graph replay, checked without a GPU.

A CUDA graph freezes every argument of the recorded launches. RecordingBackend gives the
CPU backend the same semantics: while the trainer captures, it records each backend call
with its arguments instead of running it, and a replay runs the recorded calls again. A
run trained that way equals an eager run only if each step's device work reads everything
that changes between steps (batch, learning rate, bias corrections, head weights) from
staged buffers, which is what a real graph needs. The GPU run itself is in
test_gpu_device.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from euler.cpu.backend import CpuBackend
from euler.training import loop as train_mod
from euler.training.step_graph import StepGraphs
from tests.train_helpers import read_metrics, tiny_config


class Slot:
    """A recorded call's result: the value of its latest replay (a DeviceScalar's stand-in)."""

    value = None

    def __float__(self) -> float:
        return float(self.value)


class Recording:
    """Recorded calls; replay() runs them with the arguments they were recorded with."""

    def __init__(self, calls: list):
        self.calls = calls
        self.nodes = len(calls)
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for fn, args, kwargs, slot in self.calls:
            out = fn(*args, **kwargs)
            if slot is not None:
                slot.value = out

    def close(self) -> None:
        self.calls = []


class RecordingBackend:
    """The CPU backend, with capture(fn) recording its calls as a CUDA graph would."""

    can_capture = True

    def __init__(self):
        self.be = CpuBackend()
        self.recording: list | None = None
        self.graphs: list[Recording] = []

    def capture(self, fn):
        self.recording = []
        try:
            result = fn()
        finally:
            calls, self.recording = self.recording, None
        graph = Recording(calls)
        self.graphs.append(graph)
        return graph, result

    def __getattr__(self, name):
        attr = getattr(self.be, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.recording is None:
                return attr(*args, **kwargs)
            slot = Slot()
            self.recording.append((attr, args, kwargs, slot))
            return slot

        return call


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_replayed_steps_train_as_eager_steps(data_root, tmp_path, monkeypatch, grad_accum):
    eager = train_mod.train(
        tiny_config(tmp_path / "eager", data_root / "pre", steps=6, grad_accum=grad_accum)
    )
    backend = RecordingBackend()
    monkeypatch.setattr(train_mod, "make_backend", lambda *a, **k: backend)
    replayed = train_mod.train(
        tiny_config(
            tmp_path / "replayed",
            data_root / "pre",
            steps=6,
            grad_accum=grad_accum,
            cuda_graph=True,
        )  # fmt: skip
    )
    # one graph per micro-batch role (first, accumulating) and one for the update
    assert len(backend.graphs) == 1 + (grad_accum > 1) + 1
    # each is captured on its second call and replayed from then on: steps 2..6
    assert all(g.replays == 5 for g in backend.graphs)
    assert all(g.nodes > 0 for g in backend.graphs)
    got = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(tmp_path / "replayed")
           if "loss" in r]  # fmt: skip
    want = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(tmp_path / "eager")
            if "loss" in r]  # fmt: skip
    assert got == want
    assert replayed["val_loss"] == eager["val_loss"]


def test_a_frozen_learning_rate_would_be_caught(data_root, tmp_path, monkeypatch):
    """The check above can fail: a step that captured lr as a value trains differently."""
    real_prepare = train_mod.AdamW.prepare
    frozen = {}

    def prepare(self, lr):
        real_prepare(self, lr)
        if "buf" not in frozen:  # every later step gets a fresh buffer the graph never reads
            frozen["buf"] = self._hyper
        else:
            self._hyper = self._hyper.copy()

    train_mod.train(tiny_config(tmp_path / "eager", data_root / "pre", steps=6))
    monkeypatch.setattr(train_mod.AdamW, "prepare", prepare)
    backend = RecordingBackend()
    monkeypatch.setattr(train_mod, "make_backend", lambda *a, **k: backend)
    train_mod.train(tiny_config(tmp_path / "frozen", data_root / "pre", steps=6, cuda_graph=True))
    losses = lambda run: [r["loss"] for r in read_metrics(run) if "loss" in r]  # noqa: E731
    assert losses(tmp_path / "frozen") != losses(tmp_path / "eager")


def test_step_graphs_run_eagerly_where_nothing_captures():
    calls = []
    graphs = StepGraphs(CpuBackend())
    assert not graphs.active
    for i in range(3):
        assert graphs.run("k", lambda i=i: calls.append(i) or i) == i
    assert calls == [0, 1, 2]
    off = StepGraphs(RecordingBackend(), enabled=False)
    assert not off.active


def test_a_new_key_warms_up_again_and_close_frees_graphs():
    backend = RecordingBackend()
    graphs = StepGraphs(backend)
    x = np.zeros((1, 1))
    add = lambda: backend.residual_forward(x, x, np.ones((1, 1)))  # noqa: E731
    for _ in range(3):
        graphs.run(("add", 1), add)
    assert x[0, 0] == 3 and len(backend.graphs) == 1 and backend.graphs[0].replays == 2
    graphs.run(("add", 2), add)  # another arena version, say: eager first
    assert x[0, 0] == 4 and len(backend.graphs) == 1
    assert graphs.nodes() == 1
    graphs.close()
    assert backend.graphs[0].calls == [] and graphs.nodes() == 0


def test_a_failed_capture_falls_back_to_launching(data_root, tmp_path, monkeypatch, capsys):
    eager = train_mod.train(tiny_config(tmp_path / "eager", data_root / "pre", steps=4))
    backend = RecordingBackend()

    def refuse(fn):
        raise RuntimeError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")

    backend.capture = refuse
    monkeypatch.setattr(train_mod, "make_backend", lambda *a, **k: backend)
    got = train_mod.train(tiny_config(tmp_path / "fallback", data_root / "pre", steps=4,
                                      cuda_graph=True))  # fmt: skip
    assert "CUDA graph capture failed (RuntimeError: CUDA_ERROR_STREAM" in capsys.readouterr().out
    assert got["val_loss"] == eager["val_loss"] and got["graph_nodes"] == 0
