"""The training loop: exact resume, Ctrl-C, schedule, accumulation, SFT mask, bad input."""

from __future__ import annotations

import dataclasses
import math
import signal

import numpy as np
import pytest

from euler.errors import EulerError
from euler.model.transformer import Model, head_scales
from euler.training import checkpoint
from euler.training import loop as train_mod
from euler.training.batches import Batches
from euler.training.config import TrainConfig, lr_at
from euler.training.loop import train
from euler.training.run_folder import read_run
from tests.train_helpers import read_metrics, run_cli, tiny_config

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder


def _losses(run) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run) if "loss" in r]


@pytest.mark.parametrize("accum", [1, 2])
def test_interrupt_and_resume_repeat_the_losses_bit_for_bit(
    data_root, tmp_path, monkeypatch, accum
):
    """llm.c's property: stop at step s (Ctrl-C), resume to N, same losses as N in one go."""
    whole = train(tiny_config(tmp_path / "whole", data_root / "pre", steps=10, grad_accum=accum))
    assert whole["steps"] == 10 and not whole["interrupted"]

    real_lr_at = train_mod.lr_at

    def ctrl_c_at_step_6(step, tc, total):  # SIGINT arrives during optimizer step 6 (0-based 5)
        if step == 5:
            signal.raise_signal(signal.SIGINT)
        return real_lr_at(step, tc, total)

    monkeypatch.setattr(train_mod, "lr_at", ctrl_c_at_step_6)
    cut = tmp_path / "cut"
    first = train(tiny_config(cut, data_root / "pre", steps=10, grad_accum=accum))
    assert first["interrupted"] and first["steps"] == 6  # finished step 6, saved, stopped
    assert checkpoint.load(cut).step == 6
    monkeypatch.setattr(train_mod, "lr_at", real_lr_at)

    tc, _ = read_run(cut)
    second = train(tc, resume=True)
    assert second["steps"] == 10
    assert _losses(cut) == _losses(tmp_path / "whole")  # exact float equality, every step
    a, b = checkpoint.load(tmp_path / "whole"), checkpoint.load(cut)
    assert a.params.tobytes() == b.params.tobytes()
    assert a.moments["v"].tobytes() == b.moments["v"].tobytes()
    vals = [r["val_loss"] for r in read_metrics(cut) if "val_loss" in r]
    assert len(vals) == 4 and all(math.isfinite(v) for v in vals)  # steps 0, 4, 8, 10
    last = [r for r in read_metrics(cut) if "val_loss" in r][-1]
    # every pretraining position has a target for every head: the objective is their mean
    assert np.mean(last["val_loss_heads"]) == pytest.approx(last["val_loss"], rel=1e-6)


def test_resume_after_a_crash_drops_the_unsaved_steps(data_root, tmp_path, monkeypatch):
    """A crash after the step-4 checkpoint: metrics of steps 5-6 are trimmed and redone."""
    run = tmp_path / "crash"
    real_lr_at = train_mod.lr_at

    def crash(step, tc, total):
        if step == 6:
            raise RuntimeError("power cut")
        return real_lr_at(step, tc, total)

    monkeypatch.setattr(train_mod, "lr_at", crash)
    with pytest.raises(RuntimeError):
        train(tiny_config(run, data_root / "pre"))
    assert max(s for s, _ in _losses(run)) == 6
    monkeypatch.setattr(train_mod, "lr_at", real_lr_at)
    train(read_run(run)[0], resume=True)
    steps = [s for s, _ in _losses(run)]
    assert steps == list(range(1, 9))


def test_resuming_a_finished_run_says_there_is_nothing_to_train(data_root, tmp_path, capsys):
    """A run at its last step, resumed: no step, no new metrics, a line saying why."""
    run = tmp_path / "done"
    train(tiny_config(run, data_root / "pre", steps=2, eval_every=2))
    before = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    summary = train(read_run(run)[0], resume=True)
    assert summary["train_tokens"] == 0 and summary["steps"] == 2
    assert "at step 2 of 2 already: nothing to train" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_bytes() == before


def test_lr_schedule_warmup_then_cosine():
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=4, steps=14)
    lrs = [lr_at(s, tc, 14) for s in range(14)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert lr_at(14, tc, 14) == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(0.55)  # half way: the mean of lr and min_lr


def test_token_budget_sets_the_steps():
    tc = TrainConfig(batch_size=2, grad_accum=3, tokens=1000, steps=99)
    assert tc.total_steps(24) == 7  # ceil(1000 / (2 * 24 * 3)) = 7 steps, `steps` ignored
    assert TrainConfig(batch_size=2, tokens=97, steps=1).total_steps(24) == 3
    assert TrainConfig(steps=5).total_steps(24) == 5


def test_grad_accumulation_matches_one_big_batch(data_root, tmp_path):
    """2 micro-batches of 2, averaged, give the gradient of the batch of 4 they make up."""
    cfg = _cfg(data_root)
    tc = tiny_config(tmp_path, data_root / "pre", batch_size=4)
    tokens, targets = Batches(tc, cfg, print).get("train", 0, 0)
    grads, losses = {}, {}
    for name in ("big", "accum"):
        model = Model(cfg, seed=0)
        if name == "big":
            losses[name] = model.forward(tokens, targets, need_grad=True)
            model.backward()
        else:  # as the trainer does: each micro-batch's head weights halved
            losses[name] = 0.0
            for a in range(2):
                rows = slice(2 * a, 2 * a + 2)
                scale = head_scales(targets[:, rows]) / 2
                losses[name] += model.forward(tokens[rows], targets[:, rows], need_grad=True,
                                              accumulate=a > 0, head_scale=scale)  # fmt: skip
                model.backward()
        grads[name] = model.grads.copy()
    np.testing.assert_allclose(grads["accum"], grads["big"], rtol=1e-4, atol=1e-7)
    assert losses["accum"] == pytest.approx(losses["big"], rel=1e-6)


def _cfg(_root):
    import dataclasses

    from euler.model.config import get_preset

    return dataclasses.replace(get_preset("tiny"), vocab_size=300)


def test_sft_targets_are_the_response_tokens_only(data_root, tmp_path):
    tc = tiny_config(tmp_path / "sft", data_root / "sft", kind="sft", batch_size=4)
    data = Batches(tc, _cfg(data_root), print)
    window, mask, seg = data.train.batch(3, 0, 4, 24, 4)
    tokens, targets = data.get("train", 3, 0)
    assert (tokens == window[:, :24]).all()
    for k in range(4):
        same = (mask[:, 1 + k : 25 + k] == 1) & (seg[:, :24] == seg[:, 1 + k : 25 + k])
        want = np.where(same, window[:, 1 + k : 25 + k], -1)
        assert (targets[k] == want).all()
    tok = data.tokenizer
    # prompt positions never have a head-0 target; the response and its <|end|> do
    for b in range(4):
        row = list(window[b])
        a = row.index(tok.assistant_id)
        assert (targets[0, b, :a] == -1).all()
        assert targets[0, b, a] == row[a + 1] != -1
        if tok.end_id in row[a:25]:
            e = a + row[a:].index(tok.end_id)
            assert targets[0, b, e - 1] == tok.end_id


def test_sft_run_starts_from_the_checkpoint(data_root, tmp_path):
    pre = tmp_path / "pre"
    train(tiny_config(pre, data_root / "pre", steps=4))
    tc = tiny_config(tmp_path / "sft", data_root / "sft", kind="sft", init_from=str(pre),
                     steps=4, preset="ignored")  # fmt: skip
    summary = train(tc)
    assert summary["steps"] == 4 and math.isfinite(summary["val_loss"])
    first_val = read_metrics(tmp_path / "sft")[0]
    assert first_val["step"] == 0 and "<|assistant|>" in first_val["sample"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(
    data_root, tmp_path, monkeypatch, precision
):
    run = tmp_path / "nan"
    real_run = Model.run
    calls = {"n": 0}

    def run_model(self, need_grad=False, accumulate=False):
        loss = real_run(self, need_grad, accumulate)
        if need_grad:
            calls["n"] += 1
            if calls["n"] == 6:  # optimizer step 6
                return float("nan")
        return loss

    monkeypatch.setattr(Model, "run", run_model)
    with pytest.raises(EulerError, match=r"loss is nan at step 6.*was finite \(step 4\)"):
        train(tiny_config(run, data_root / "pre", precision=precision))
    assert checkpoint.load(run).step == 4


def test_a_bf16_run_resumes_in_fp32_and_back(data_root, tmp_path):
    """Checkpoints hold the float32 masters: a bf16 run (the CPU's emulation) continues in
    fp32 and then in bf16 again, run.json saying which. Its bf16 steps repeat those of an
    uninterrupted bf16 run exactly, and the first fp32 step after the switch, from the same
    weights, differs from the bf16 run's by bf16 rounding only. (A constant learning rate,
    so that the longer --steps of each resume leaves the schedule as it was.)"""
    whole, run = tmp_path / "bf16", tmp_path / "mixed"
    flat = dict(precision="bf16", lr=1e-2, min_lr=1e-2, warmup_steps=0)
    train(tiny_config(whole, data_root / "pre", steps=12, **flat))
    train(tiny_config(run, data_root / "pre", steps=4, **flat))
    for steps, precision in ((8, "fp32"), (12, "bf16")):
        tc, _ = read_run(run)
        train(dataclasses.replace(tc, steps=steps, precision=precision), resume=True)
        assert read_run(run)[0].precision == precision
        assert checkpoint.load(run).params.dtype == np.float32
    got, want = _losses(run), _losses(whole)
    assert [s for s, _ in got] == list(range(1, 13))
    assert got[:4] == want[:4]  # the same bf16 steps, bit for bit
    assert got[4] != want[4] and abs(got[4][1] - want[4][1]) < 1e-2 * want[4][1]
    assert all(math.isfinite(loss) for _, loss in got) and got[-1][1] < got[0][1]


def test_bad_settings_are_refused(data_root, tmp_path):
    with pytest.raises(EulerError, match="--batch-size"):
        tiny_config(tmp_path, data_root / "pre", batch_size=0)
    with pytest.raises(EulerError, match="--device"):
        tiny_config(tmp_path, data_root / "pre", device="tpu")
    with pytest.raises(EulerError, match="context"):
        train(tiny_config(tmp_path / "r", data_root / "pre", seq_len=25))
    with pytest.raises(EulerError, match="not found"):
        train(tiny_config(tmp_path / "r", tmp_path / "nowhere"))


def test_precision_flags_reach_the_gpu_backend(monkeypatch, capsys):
    """--precision (default tf32 on cuda) and --exact-attention choose the GpuBackend's
    products and attention; bf16 asks the GPU for bf16 support first."""
    import euler.gpu.backend as gpu_backend

    seen = []

    class FakeGpu:
        def __init__(self, tf32=True, tc_attention=True):
            seen.append((tf32, tc_attention))
            raise EulerError("stop here")

    monkeypatch.setattr(gpu_backend, "GpuBackend", FakeGpu)
    monkeypatch.setattr(gpu_backend, "check_bf16_support", lambda: seen.append("bf16?"))
    for flags in ([], ["--precision", "fp32"], ["--exact-attention"], ["--precision", "bf16"]):
        code, _, err = run_cli(monkeypatch, capsys, "train", "--device", "cuda", *flags)
        assert code == 2 and err == "error: stop here\n"
    assert seen == [(True, True), (False, True), (True, False), "bf16?", (True, True)]
    assert TrainConfig().precision == "fp32" and TrainConfig(device="cuda").precision == "tf32"


def test_bf16_below_compute_capability_8_is_refused_naming_it(monkeypatch):
    from euler.precision import check_bf16_capability

    with pytest.raises(EulerError, match=r"compute capability 7\.5; bf16 needs 8\.0 .* tf32"):
        check_bf16_capability((7, 5), "Tesla T4")
    check_bf16_capability((9, 0))


def test_version_1_run_json_reads_its_tf32_as_a_precision():
    old = dataclasses.asdict(TrainConfig(device="cuda"))
    del old["precision"]
    old.update(version=1, tf32=False)
    assert TrainConfig.from_dict(old).precision == "fp32"
    old["tf32"] = True
    assert TrainConfig.from_dict(old).precision == "tf32"
    old["device"] = "cpu"
    assert TrainConfig.from_dict(old).precision == "fp32"


def test_batch_too_big_for_the_device_is_refused_before_step_1(tmp_path, data_root, monkeypatch):
    """A backend with room for 4 sequences' activations: 64 is refused in one line, before
    the run folder is made; 2 trains."""
    import euler.training.loop
    from euler.cpu.backend import CpuBackend
    from euler.model.transformer import arena_bytes

    room = {}

    class SmallDevice(CpuBackend):
        def free_memory(self) -> int:
            return euler.training.loop.MEMORY_SLACK + 4 * room["one"]

    monkeypatch.setattr(euler.training.loop, "make_backend", lambda *args: SmallDevice())
    tc = tiny_config(tmp_path / "r", data_root / "pre", batch_size=64, steps=1)
    cfg = tc.model_config()  # with the vocabulary of the data's tokenizer:
    cfg = dataclasses.replace(cfg, vocab_size=Batches(tc, cfg).tokenizer.vocab_size)
    room["one"] = arena_bytes(cfg, np.float32, 1, 24)
    need = arena_bytes(cfg, np.float32, 64, 24) + euler.training.loop.MEMORY_SLACK
    free = euler.training.loop.MEMORY_SLACK + 4 * room["one"]
    msg = (
        rf"--batch-size 64 x --seq-len 24 needs {need / 2**20:.1f} MiB .*, "
        rf"{free / 2**20:.1f} MiB is free"
    )
    with pytest.raises(EulerError, match=msg):
        train(tc)
    assert not (tmp_path / "r").exists()
    train(tiny_config(tmp_path / "r", data_root / "pre", batch_size=2, steps=1))
