"""`euler train`, `euler sft`, `euler plot` from the command line, and their one-line errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal

import numpy as np
import pytest

from euler.model.config import get_preset
from euler.model.params import ParamLayout
from euler.training import checkpoint
from tests.train_helpers import one_line_error, read_metrics, run_cli

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder

TINY = ["--preset", "tiny", "--batch-size", "2", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "3", "--ckpt-every", "2", "--warmup-steps", "1"]  # fmt: skip


def test_train_then_refuse_the_held_folder_then_overwrite_and_resume(
    data_root, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run)]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--steps", "2")
    assert code == 0, err
    assert "val loss" in out and "tokens/s" in out
    assert json.loads((run / "run.json").read_text())["train"]["steps"] == 2

    code, _, err = run_cli(monkeypatch, capsys, *args, "--steps", "4")
    one_line_error(code, err, "already holds a pretrain run (tiny preset)", "--overwrite")

    code, _, err = run_cli(monkeypatch, capsys, *args, "--steps", "4", "--overwrite")
    assert code == 0, err
    assert checkpoint.load(run).step == 4
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4]

    code, out, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run))
    assert code == 0 and f"resuming {run} at step 4" in out


def test_ctrl_c_saves_and_exits_130(data_root, tmp_path, monkeypatch, capsys):
    from euler.training import loop as train_mod

    real_lr_at = train_mod.lr_at

    def ctrl_c(step, tc, total):
        if step == 2:
            signal.raise_signal(signal.SIGINT)
        return real_lr_at(step, tc, total)

    monkeypatch.setattr(train_mod, "lr_at", ctrl_c)
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--steps", "9"]
    code, out, _ = run_cli(monkeypatch, capsys, *args)
    assert code == 130 and f"interrupted: checkpoint at step 3 in {run}" in out
    assert checkpoint.load(run).step == 3


def test_resume_refuses_a_checkpoint_of_another_architecture(
    data_root, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--steps", "2"]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    other = dataclasses.replace(get_preset("tiny"), vocab_size=300, n_layer=3)
    params = np.zeros(ParamLayout(other).size, np.float32)
    mom = {"m": params, "v": params}
    checkpoint.save(run / "checkpoint.safetensors", other, params, mom, {"step": 2}, {}, "{}")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run))
    one_line_error(code, err, "checkpoint has n_layer=3", "needs n_layer=2")


def test_sft_refuses_a_checkpoint_with_another_tokenizer(data_root, tmp_path, monkeypatch, capsys):
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=300)
    params = np.zeros(ParamLayout(cfg).size, np.float32)
    ck = tmp_path / "other.safetensors"
    checkpoint.save(ck, cfg, params, None, {"step": 5}, {}, '{"another": "tokenizer"}')
    code, _, err = run_cli(monkeypatch, capsys, "sft", "--checkpoint", str(ck), "--data",
                           str(data_root / "sft"), "--out", str(tmp_path / "sft"))  # fmt: skip
    one_line_error(code, err, "was tokenized by tokenizer", "uses tokenizer")


def test_sft_runs_and_resumes_from_the_command_line(data_root, tmp_path, monkeypatch, capsys):
    pre = tmp_path / "pre"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(pre), "--steps", "2"]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    sft = tmp_path / "sft"
    args = ["sft", "--checkpoint", str(pre), "--data", str(data_root / "sft"), "--out", str(sft),
            "--batch-size", "2", "--steps", "3", "--eval-every", "3"]  # fmt: skip
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "<|assistant|>" in out and checkpoint.load(sft).step == 3
    shutil.rmtree(pre)  # resuming needs only the SFT run's own folder
    code, out, err = run_cli(monkeypatch, capsys, "sft", "--resume", str(sft))
    assert code == 0 and f"resuming {sft} at step 3" in out


def test_sft_needs_its_inputs(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "sft", "--out", str(tmp_path / "s"))
    one_line_error(code, err, "--checkpoint CHECKPOINT and --data")


def test_cuda_without_a_gpu_is_one_line(data_root, tmp_path, monkeypatch, capsys):
    try:
        from numba import cuda

        if cuda.is_available():
            pytest.skip("a GPU is present: --device cuda would train")
    except ImportError:
        pass
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(tmp_path / "g")]
    code, _, err = run_cli(monkeypatch, capsys, *args, "--device", "cuda")
    one_line_error(code, err, "GPU")


def test_plot_writes_a_png(data_root, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--steps", "3"]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    code, out, err = run_cli(monkeypatch, capsys, "plot", "--checkpoint", str(run))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        one_line_error(code, err, "pip install -e '.[plot]'")
        return
    assert code == 0, err
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other = tmp_path / "other"  # a shorter run: the overlay stops at its last step
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(other), "--steps", "2"]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, "plot", "--checkpoint", str(run), "--checkpoint",
                           str(other), "-o", str(tmp_path / "both.png"))  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run_cli(monkeypatch, capsys, "plot", "--checkpoint", str(tmp_path / "nowhere"))
    one_line_error(code, err, "no metrics to plot")


# ---------------------------------------------------------------------------- flags


def _commands():
    """The click commands of `euler train` and `euler sft`, by the kind each runs."""
    import typer
    from euler.cli.main import _register_families, app

    _register_families()
    group = typer.main.get_command(app)
    return {"pretrain": group.commands["train"], "sft": group.commands["sft"]}


def _parsed(monkeypatch, capsys, *args: str):
    """The TrainConfig that `euler ARGS` (train or sft) would run."""
    import euler.cli.commands_train as commands

    seen = []

    def run(kind, settings, *rest):
        seen.append(commands._train_config(kind, settings))

    monkeypatch.setattr(commands, "_run", run)
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    return seen[0]


def test_every_train_config_setting_is_a_flag_with_its_default(monkeypatch, capsys):
    """Each TrainConfig field is a flag of both commands, with TrainConfig's default, unless
    it says otherwise; a field that declares nothing breaks the test."""
    from euler.training.config import TrainConfig, flag_default, flag_name

    commands = _commands()
    not_flags, one_command = set(), {}
    for f in dataclasses.fields(TrainConfig):
        assert "flag" in f.metadata, f"TrainConfig.{f.name}: no setting(...) or no_flag(...)"
        flag = f.metadata["flag"]
        if flag is None:
            not_flags.add(f.name)
            continue
        if len(flag.kinds) < 2:
            one_command[f.name] = flag.kinds
        for kind in flag.kinds:
            params = {p.name: p for p in commands[kind].params}
            assert f.name in params, f"{kind}: no option for TrainConfig.{f.name}"
            option = params[f.name]
            assert flag_name(f.name) in option.opts
            default = flag_default(f, kind)
            got = (
                str(option.default) if flag.path and option.default is not None else option.default
            )
            assert got == default, (kind, f.name, option.default, default)
    # the exceptions, deliberately: set by the command or fixed; one command only
    assert not_flags == {"kind", "beta1", "beta2", "version"}
    pretrain_only = ("preset", "seq_len", "n_layer", "d_model", "n_head", "n_kv_head", "context",
                     "tie_embeddings")  # sft takes its architecture from --checkpoint  # fmt: skip
    assert one_command == {"init_from": ("sft",), **dict.fromkeys(pretrain_only, ("pretrain",))}

    # the defaults a user gets are TrainConfig's (and, for sft, these)
    assert _parsed(monkeypatch, capsys, "train") == TrainConfig()
    sft = _parsed(monkeypatch, capsys, "sft", "--checkpoint", "ck", "--data", "d")
    assert sft == TrainConfig(kind="sft", init_from="ck", data="d", out_dir="runs/sft",
                              steps=300, lr=1e-3, min_lr=1e-4, warmup_steps=20, eval_every=50,
                              ckpt_every=50)  # fmt: skip


def _other_value(f, value):
    """A valid value of field f that differs from `value`, as a command-line argument."""
    if isinstance(value, bool):
        return not value
    if f.name == "device":
        return "cuda"
    if f.name == "preset":
        return "tiny"
    if f.name == "precision":  # not bf16: --exact-attention is given too
        return "fp32"
    sizes = {"d_model": 48, "n_head": 6, "n_kv_head": 3}  # a possible architecture together
    if f.name in sizes:
        return sizes[f.name]
    if f.type in ("str", "str | None"):
        return "some/folder"
    return value / 2 if isinstance(value, float) else value + 3


def test_every_flag_reaches_its_field(monkeypatch, capsys):
    """Every flag given at once, each with a value other than its default: each lands in its
    field."""
    from euler.training.config import TrainConfig, flag_default, flag_name

    for command, kind in (("train", "pretrain"), ("sft", "sft")):
        args, want = [], {}
        for f in dataclasses.fields(TrainConfig):
            flag = f.metadata["flag"]
            if flag is None or kind not in flag.kinds:
                continue
            want[f.name] = value = _other_value(f, flag_default(f, kind))
            if isinstance(value, bool):
                args.append(("--" if value else "--no-") + f.name.replace("_", "-"))
            else:
                args += [flag_name(f.name), str(value)]
        tc = _parsed(monkeypatch, capsys, command, *args)
        assert {name: getattr(tc, name) for name in want} == want


def test_a_field_without_a_flag_is_refused():
    """A TrainConfig field added without setting(...) or no_flag(...) stops the commands'
    options from being built; with setting(...) it becomes an option of both."""
    from euler.cli.commands_train import train_config_parameters

    from euler.errors import EulerError
    from euler.training.config import TrainConfig, setting

    bare = dataclasses.make_dataclass("Bare", [("new_knob", int, 0)], bases=(TrainConfig,),
                                      frozen=True)  # fmt: skip
    for kind in ("pretrain", "sft"):
        with pytest.raises(EulerError, match="TrainConfig.new_knob declares no flag"):
            train_config_parameters(kind, bare)
    flagged = dataclasses.make_dataclass(
        "Flagged", [("new_knob", int, setting(7, "A new knob."))], bases=(TrainConfig,),
        frozen=True,
    )  # fmt: skip
    for kind in ("pretrain", "sft"):
        params = {p.name: p for p in train_config_parameters(kind, flagged)}
        assert params["new_knob"].default == 7


def test_threads_flag_sets_the_threads_and_refuses_a_count_beyond_the_pool(
    data_root, tmp_path, monkeypatch, capsys
):
    import numba

    before = numba.get_num_threads()
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--steps", "1"]
    try:
        code, out, err = run_cli(monkeypatch, capsys, *args, "--threads", "1")
        assert code == 0, err
        assert "on cpu (1 threads)" in out
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    pool = numba.config.NUMBA_NUM_THREADS
    for command in (args, ["eval", "--checkpoint", str(run), "--text", str(data_root / "pre")],
                    ["chat", "--checkpoint", str(run), "--prompt", "hi"],
                    ["bench", "--preset", "tiny"], ["gradcheck"],
                    ["sample", "--checkpoint", str(run)]):  # fmt: skip
        for bad in ("0", str(pool + 1)):
            code, _, err = run_cli(monkeypatch, capsys, *command, "--threads", bad)
            one_line_error(code, err, "--threads must be in [1,", f"got {bad}")
    assert numba.get_num_threads() == before


def test_default_threads_are_the_cores_this_process_may_use(monkeypatch):
    import numba

    from euler import threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {3})
    assert threads.pick_threads(None) == 1
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(10**4)))
    assert threads.pick_threads(None) == numba.config.NUMBA_NUM_THREADS


def test_model_size_flags_build_the_architecture_and_resume_it(
    data_root, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--steps", "1",
            "--n-layer", "1", "--d-model", "24", "--n-head", "3", "--n-kv-head", "1",
            "--context", "16", "--tie-embeddings"]  # fmt: skip
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    cfg = checkpoint.load(run).cfg
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.context) == (1, 24, 3, 1, 16)
    assert cfg.tie_embeddings and cfg.ffn_hidden == 8 * 24 // 3
    code, out, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run), "--steps", "2")
    assert code == 0, err
    assert checkpoint.load(run).cfg == cfg


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--d-model", "25", "--n-head", "4"), "--d-model (25) must be divisible by n_head"),
        (("--n-head", "8", "--n-kv-head", "3"), "--n-head (8) must be divisible by n_kv_head"),
        (("--n-layer", "-1"), "--n-layer must be an integer in [0,"),
        (("--context", str(1 << 21)), "--context must be an integer in [0,"),
    ],
)
def test_impossible_model_sizes_are_one_line(tmp_path, monkeypatch, capsys, flags, named):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--out",
                           str(tmp_path / "r"), *flags)  # fmt: skip
    one_line_error(code, err, named)
    assert not (tmp_path / "r").exists()


def test_a_run_json_from_before_the_size_flags_reads_as_the_preset():
    from euler.training.config import MODEL_SIZES, TrainConfig

    old = TrainConfig(preset="tiny").to_dict()
    for name in (*MODEL_SIZES, "tie_embeddings"):
        del old[name]
    tc = TrainConfig.from_dict(old)
    assert tc.model_config() == get_preset("tiny")


def test_keep_every_and_keep_best_keep_checkpoints_beside_the_latest(
    data_root, tmp_path, monkeypatch, capsys
):
    from euler.training.run_folder import kept_name

    run = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run), "--eval-every",
            "1", "--ckpt-every", "1", "--keep-every", "2", "--keep-best"]  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args, "--steps", "4")
    assert code == 0, err
    kept = {p.name for p in run.glob("checkpoint-*.safetensors")}
    assert kept == {kept_name(2), kept_name(4), kept_name(None)}
    assert checkpoint.load(run / kept_name(2)).step == 2
    assert (
        checkpoint.load(run / kept_name(4)).params.tobytes()
        == checkpoint.load(run).params.tobytes()
    )
    vals = {r["step"]: r["val_loss"] for r in read_metrics(run) if "val_loss" in r}
    best = checkpoint.load(run / kept_name(None))
    assert best.state["val_loss"] == min(vals.values())
    assert best.step == min(vals, key=vals.get)
    # a resumed run keeps going under the same rules; --overwrite clears every kept file
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run), "--steps", "6")
    assert code == 0, err
    assert kept_name(6) in {p.name for p in run.glob("checkpoint-*.safetensors")}
    code, _, err = run_cli(monkeypatch, capsys, *args[:-3], "--steps", "1", "--overwrite")
    assert code == 0, err
    assert not list(run.glob("checkpoint-*.safetensors"))


def _events(folder):
    """Every (tag, step, value or text) in the TensorBoard event files of `folder`, read back
    from their records (length, crc, event proto, crc)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    got = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + n])
            at += 12 + n + 4
            for v in event.summary.value:
                text = v.tensor.string_val[0].decode() if v.tensor.string_val else None
                got.append((v.tag, event.step, text if text is not None else v.simple_value))
    return got


def test_tensorboard_events_hold_the_metrics(data_root, tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboardX")
    run, tb = tmp_path / "run", tmp_path / "tb"
    args = ["train", *TINY, "--data", str(data_root / "pre"), "--out", str(run),
            "--tensorboard", str(tb), "--steps", "2", "--log-every", "1"]  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    events = _events(tb)
    lines = read_metrics(run)
    losses = {r["step"]: r["loss"] for r in lines if "loss" in r}
    assert {s: v for t, s, v in events if t == "loss"} == pytest.approx(losses)
    vals = {r["step"]: r["val_loss_heads"][0] for r in lines if "val_loss_heads" in r}
    assert {s: v for t, s, v in events if t == "val_loss_heads/0"} == pytest.approx(vals)
    for bad, named in ((run, "is the run folder"), (data_root / "pre", "holds")):
        code, _, err = run_cli(monkeypatch, capsys, *args, "--tensorboard", str(bad),
                               "--overwrite")  # fmt: skip
        one_line_error(code, err, f"--tensorboard {bad}", named)
