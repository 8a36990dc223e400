"""Bad input to `euler train`, `euler sft`, `euler chat` and `euler plot`: one line, exit 2,
nothing touched; and the behaviour the refusals sit beside (a longer --steps on resume, a
run that diverges, a killed save's temporary files).

Each case runs in its own folder (`{root}`); `{data}` is the shared prepared data, `{ck}`
a fine-tuned run's checkpoint. A case that needs a run folder copies one of the runs that
the module trains once (pretraining, SFT, a run sized by --tokens).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from euler.training import checkpoint
from euler.training import loop as train_mod
from euler.training.loop import train
from tests.bad_input import Case, assert_refused
from tests.train_helpers import read_metrics, run_cli, tiny_config

RUNS: dict[str, Path] = {}  # kind -> a finished run folder, trained once per module
LOCKS: list[int] = []  # lock files the cases hold, as another process would


@pytest.fixture(scope="module", autouse=True)
def _runs(data_root, tmp_path_factory):
    """A pretraining run (2 steps, a checkpoint at 2), an SFT run from it, and a pretraining
    run sized by --tokens."""
    root = tmp_path_factory.mktemp("runs")
    quick = dict(steps=2, ckpt_every=2, eval_every=2, eval_batches=1, sample_tokens=0)
    train(tiny_config(root / "pre", data_root / "pre", **quick))
    train(tiny_config(root / "sft", data_root / "sft", kind="sft", init_from=str(root / "pre"),
                      **quick))  # fmt: skip
    train(tiny_config(root / "tokens", data_root / "pre", **{**quick, "tokens": 96}))
    RUNS.update(pre=root / "pre", sft=root / "sft", tokens=root / "tokens")
    yield
    RUNS.clear()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
    yield
    while LOCKS:
        os.close(LOCKS.pop())


# ---------------------------------------------------------------------------- setups


def run_copy(kind: str = "pre", edit: Callable[[Path], None] | None = None):
    """A setup: `{root}/run` is a copy of the module's `kind` run, then edit(run) changes it."""

    def setup(root: Path) -> None:
        shutil.copytree(RUNS[kind], root / "run")
        if edit is not None:
            edit(root / "run")

    return setup


def run_json(change: Callable[[dict], object]):
    """A setup: a copy of the pretraining run whose run.json is change(the parsed run.json)
    (change edits it in place and returns None, or returns what to write instead)."""

    def edit(run: Path) -> None:
        doc = json.loads((run / "run.json").read_text())
        new = change(doc)
        doc = doc if new is None else new
        text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
        mode = "wb" if isinstance(text, bytes) else "w"
        with open(run / "run.json", mode) as f:
            f.write(text)

    return run_copy("pre", edit)


def locked(setup=None, pid: int = 4242, folder: str = "run"):
    """A setup: `{root}/FOLDER` (made by setup, else empty) whose lock another process holds."""

    def lock(root: Path) -> None:
        if setup is not None:
            setup(root)
        run = root / folder
        run.mkdir(exist_ok=True)
        fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
        os.write(fd, f"{pid}\n".encode())
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: refused to this process too
        LOCKS.append(fd)

    return lock


def foreign_checkpoint(run: Path) -> None:
    """The checkpoint of another run (the SFT-free `tokens` run's) beside this run.json."""
    shutil.copy(RUNS["tokens"] / checkpoint.CHECKPOINT_NAME, run / checkpoint.CHECKPOINT_NAME)


def resave_checkpoint(run: Path, weights_only: bool = False, drop_run_id: bool = False):
    """Rewrite the run's checkpoint: without its moments, or without its run id."""
    ck = checkpoint.load(run)
    state = {k: v for k, v in ck.state.items() if not (drop_run_id and k == "run_id")}
    checkpoint.save(run / checkpoint.CHECKPOINT_NAME, ck.cfg, ck.params,
                    None if weights_only else ck.moments, state, ck.train_config,
                    ck.tokenizer_json)  # fmt: skip


def metrics(text: str | bytes):
    """A setup: `{root}/run` holding only metrics.jsonl with this text."""

    def setup(root: Path) -> None:
        (root / "run").mkdir()
        data = text.encode() if isinstance(text, str) else text
        (root / "run" / "metrics.jsonl").write_bytes(data)

    return setup


def a_file(name: str, text: str = "not a folder\n"):
    """A setup: a plain file `{root}/NAME`."""
    return lambda root: (root / name).write_text(text)


def set_train(key: str, value):
    def change(doc: dict) -> None:
        doc["train"][key] = value

    return run_json(change)


def drop(*keys: str):
    def change(doc: dict) -> None:
        d = doc
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]

    return run_json(change)


# ---------------------------------------------------------------------------- the cases

TRAIN = ("train", "--preset", "tiny", "--data", "{data}/pre", "--out", "{root}/run",
         "--batch-size", "2", "--steps", "2", "--eval-batches", "1",
         "--sample-tokens", "0")  # fmt: skip
SFT = ("sft", "--checkpoint", "{root}/run", "--data", "{data}/sft", "--out", "{root}/sft",
       "--batch-size", "2", "--steps", "2")  # fmt: skip
RESUME = ("train", "--resume", "{root}/run")
CHAT = ("chat", "--checkpoint", "{ck}", "--prompt", "Say sun twice.")
GOOD_STEP = '{"step": 1, "loss": 5.0, "lr": 0.001, "grad_norm": 1.0, "tokens": 48, "tok_s": 1.0}\n'

FLAG_CASES = [
    # (flag, value, words): the flag's own check, before anything is read
    ("--batch-size", "0", ()),
    ("--batch-size", "-3", ()),
    ("--batch-size", "100000", ()),
    ("--grad-accum", "0", ()),
    ("--steps", "-1", ()),
    ("--tokens", "-5", ()),
    ("--lr", "0", ()),
    ("--lr", "-1", ()),
    ("--lr", "nan", ()),
    ("--lr", "inf", ()),
    ("--min-lr", "-0.1", ()),
    ("--min-lr", "nan", ()),
    ("--min-lr", "1", ("0.003",)),
    ("--weight-decay", "-0.1", ()),
    ("--weight-decay", "nan", ()),
    ("--weight-decay", "inf", ()),
    ("--grad-clip", "-1", ()),
    ("--grad-clip", "nan", ()),
    ("--grad-clip", "inf", ()),
    ("--seed", "-1", ()),
    ("--seed", str(2**64), ()),
    ("--eval-every", "0", ()),
    ("--eval-batches", "0", ()),
    ("--ckpt-every", "0", ()),
    ("--log-every", "0", ()),
    ("--sample-tokens", "-1", ()),
    ("--warmup-steps", "-1", ()),
    ("--seq-len", "-1", ()),
    ("--seq-len", "25", ("context",)),
    ("--device", "tpu", ()),
    ("--preset", "huge", ("'huge'",)),
    ("--nproc", "0", ()),
    ("--nproc", "-2", ()),
    ("--nproc", "5000", ()),
    ("--batch-size", "abc", ("integer",)),
    ("--lr", "fast", ()),
]

CASES = (
    [
        Case(f"train {flag} {value}", (*TRAIN, flag, value), (flag, *words))
        for flag, value, words in FLAG_CASES
    ]
    + [
        Case("train no steps nor tokens", (*TRAIN, "--steps", "0"), ("--steps or --tokens",)),
        Case("train unknown flag", (*TRAIN, "--colour", "red"), ("--colour",)),
        Case("train data missing", (*TRAIN, "--data", "{root}/nowhere"), ("{root}/nowhere",)),
        Case(
            "train data is a file",
            (*TRAIN, "--data", "{root}/f.txt"),
            ("{root}/f.txt",),
            a_file("f.txt"),
        ),  # fmt: skip
        Case("train data of sft", (*TRAIN, "--data", "{data}/sft"), ("manifest.json", "kind")),
        Case(
            "train out is a file",
            (*TRAIN, "--out", "{root}/f.txt"),
            ("{root}/f.txt", "is a file"),
            a_file("f.txt"),
        ),  # fmt: skip
        Case(
            "train out holds a run",
            TRAIN,
            ("already holds a pretrain run", "--overwrite"),
            run_copy(),
        ),  # fmt: skip
        Case(
            "train out holds a damaged run",
            TRAIN,
            ("already holds a run", "--resume"),
            run_json(lambda doc: "{"),
        ),  # fmt: skip
        Case(
            "train out in use", TRAIN, ("{root}/run is in use by another run (PID 4242)",), locked()
        ),  # fmt: skip
        Case(
            "train out holds a run in use",
            TRAIN,
            ("{root}/run is in use by another run (PID 4242)",),
            locked(run_copy()),
        ),  # a run that trains there now: --resume, which 'already holds' offers, is refused too
        Case(
            "train overwrite in use",
            (*TRAIN, "--overwrite"),
            ("in use by another run (PID 77)",),
            locked(run_copy(), pid=77),
        ),  # fmt: skip
        Case(
            "train --nproc 2 into a folder in use",
            (*TRAIN, "--batch-size", "4", "--nproc", "2"),
            ("in use by another run (PID 4242)",),
            locked(),
        ),
        Case(
            "resume --nproc 2 of a run in use",
            (*RESUME, "--nproc", "2"),
            ("in use by another run (PID 4242)",),
            locked(run_copy()),
        ),
        Case(
            "train batch not split by nproc",
            (*TRAIN, "--batch-size", "3", "--nproc", "2"),
            ("--batch-size 3", "2 ranks"),
        ),  # fmt: skip
        # sft
        Case(
            "sft without from",
            ("sft", "--data", "{data}/sft", "--out", "{root}/s"),
            ("--checkpoint",),
        ),
        Case("sft from missing", SFT, ("checkpoint not found", "{root}/run")),
        Case(
            "sft from a data folder",
            (*SFT[:1], "--checkpoint", "{data}/pre", *SFT[3:]),
            ("checkpoint not found",),
        ),  # fmt: skip
        Case(
            "sft data of pretraining",
            (*SFT, "--data", "{data}/pre"),
            ("kind", "'pretrain'"),
            run_copy(),
        ),  # fmt: skip
        Case("sft lr nan", (*SFT, "--lr", "nan"), ("--lr",), run_copy()),
        Case("sft has no seq-len", (*SFT, "--seq-len", "8"), ("--seq-len",), run_copy()),
        Case("sft has no preset", (*SFT, "--preset", "tiny"), ("--preset",), run_copy()),
        Case(
            "sft out in use",
            SFT,
            ("{root}/sft is in use by another run (PID 9)",),
            locked(run_copy(), pid=9, folder="sft"),
        ),  # fmt: skip
        # --resume: the folder
        Case(
            "resume missing",
            ("train", "--resume", "{root}/nowhere"),
            ("{root}/nowhere", "run folder not found"),
        ),  # fmt: skip
        Case(
            "resume a file",
            ("train", "--resume", "{root}/f.txt"),
            ("{root}/f.txt", "is a file"),
            a_file("f.txt"),
        ),  # fmt: skip
        Case(
            "resume run.json itself",
            ("train", "--resume", "{root}/run/run.json"),
            ("is a file",),
            run_copy(),
        ),  # fmt: skip
        Case(
            "resume an empty folder",
            RESUME,
            ("not a run folder", "run.json"),
            lambda root: (root / "run").mkdir(),
        ),  # fmt: skip
        Case("resume in use", RESUME, ("in use by another run (PID 4242)",), locked(run_copy())),
        # --resume: run.json's shape
        Case("run.json invalid", RESUME, ("run/run.json", "invalid JSON"), run_json(lambda d: "{")),
        Case("run.json empty", RESUME, ("run/run.json", "invalid JSON"), run_json(lambda d: "")),
        Case(
            "run.json not utf-8",
            RESUME,
            ("run/run.json", "UTF-8"),
            run_json(lambda d: b'{"run_id": "\xff"}'),
        ),  # fmt: skip
        Case(
            "run.json a list",
            RESUME,
            ("run/run.json", "a JSON object", "a list"),
            run_json(lambda d: [d]),
        ),  # fmt: skip
        Case(
            "run.json NaN",
            RESUME,
            ("run/run.json", "NaN"),
            run_json(lambda d: json.dumps(d).replace('"lr": 0.01', '"lr": NaN')),
        ),  # fmt: skip
        Case(
            "run.json unknown key",
            RESUME,
            ("run/run.json", "extra", "unknown field"),
            run_json(lambda d: d.update(extra=1)),
        ),  # fmt: skip
        Case("run.json no run_id", RESUME, ("run/run.json", "run_id", "missing"), drop("run_id")),
        Case(
            "run.json run_id a number",
            RESUME,
            ("run/run.json", "run_id", "a string"),
            run_json(lambda d: d.update(run_id=5)),
        ),  # fmt: skip
        Case(
            "run.json run_id a path",
            RESUME,
            ("run/run.json", "run_id", "'../x'"),
            run_json(lambda d: d.update(run_id="../x")),
        ),  # fmt: skip
        Case("run.json no train", RESUME, ("run/run.json", "train", "missing"), drop("train")),
        Case(
            "run.json train a list",
            RESUME,
            ("run/run.json", "train", "a JSON object"),
            run_json(lambda d: d.update(train=[])),
        ),  # fmt: skip
        Case(
            "run.json no train.steps",
            RESUME,
            ("run/run.json", "train.steps", "missing"),
            drop("train", "steps"),
        ),  # fmt: skip
        Case(
            "run.json train.lr a string",
            RESUME,
            ("run/run.json", "train.lr", "'fast'"),
            set_train("lr", "fast"),
        ),  # fmt: skip
        Case(
            "run.json train.lr negative",
            RESUME,
            ("run/run.json", "train", "--lr", "-1"),
            set_train("lr", -1),
        ),  # fmt: skip
        Case(
            "run.json train.batch_size 2.5",
            RESUME,
            ("run/run.json", "train.batch_size", "2.5"),
            set_train("batch_size", 2.5),
        ),  # fmt: skip
        Case(
            "run.json train.batch_size true",
            RESUME,
            ("train.batch_size", "true"),
            set_train("batch_size", True),
        ),  # fmt: skip
        Case(
            "run.json train.batch_size 0",
            RESUME,
            ("run/run.json", "--batch-size"),
            set_train("batch_size", 0),
        ),  # fmt: skip
        Case(
            "run.json train.seed negative",
            RESUME,
            ("run/run.json", "--seed"),
            set_train("seed", -4),
        ),  # fmt: skip
        Case(
            "run.json train.grad_clip huge",
            RESUME,
            ("run/run.json", "train.grad_clip"),
            run_json(lambda d: json.dumps(d).replace('"grad_clip": 1.0', '"grad_clip": 1e999')),
        ),  # fmt: skip
        Case("run.json train.beta2 1", RESUME, ("run/run.json", "beta2"), set_train("beta2", 1.0)),
        Case(
            "run.json train.kind other",
            RESUME,
            ("run/run.json", "kind", "'other'"),
            set_train("kind", "other"),
        ),  # fmt: skip
        Case(
            "run.json train.device tpu",
            RESUME,
            ("run/run.json", "--device"),
            set_train("device", "tpu"),
        ),  # fmt: skip
        Case(
            "run.json train.preset huge",
            RESUME,
            ("run/run.json", "--preset"),
            set_train("preset", "huge"),
        ),  # fmt: skip
        Case(
            "run.json train unknown field",
            RESUME,
            ("run/run.json", "train.colour", "unknown"),
            set_train("colour", "red"),
        ),  # fmt: skip
        Case(
            "run.json train.version 3",
            RESUME,
            ("run/run.json", "version 3"),
            set_train("version", 3),
        ),  # fmt: skip
        Case("run.json no model", RESUME, ("run/run.json", "model", "missing"), drop("model")),
        Case(
            "run.json model.n_layer a string",
            RESUME,
            ("run/run.json", "model", "n_layer"),
            run_json(lambda d: d["model"].update(n_layer="two")),
        ),  # fmt: skip
        # --resume: flags it would ignore, and the ones it takes
        Case("resume with --lr", (*RESUME, "--lr", "0.1"), ("--lr", "would ignore"), run_copy()),
        Case("resume with --lr at its value", (*RESUME, "--lr", "0.01"), ("--lr",), run_copy()),
        Case(
            "resume with two flags",
            (*RESUME, "--seed", "3", "--batch-size", "4"),
            ("--batch-size, --seed",),
            run_copy(),
        ),  # fmt: skip
        Case("resume with --out", (*RESUME, "--out", "{root}/other"), ("--out",), run_copy()),
        Case("resume with --data", (*RESUME, "--data", "{data}/pre"), ("--data",), run_copy()),
        Case(
            "resume with --exact-attention in bf16",
            (*RESUME, "--precision", "bf16", "--exact-attention"),
            ("--exact-attention", "--precision tf32"),
            run_copy(),
        ),
        Case(
            "resume with --precision tf32 on the cpu",
            (*RESUME, "--precision", "tf32"),
            ("--precision tf32", "takes fp32 or bf16"),
            run_copy(),
        ),
        Case(
            "resume with --overwrite",
            (*RESUME, "--overwrite"),
            ("--overwrite", "--resume"),
            run_copy(),
        ),  # fmt: skip
        Case(
            "resume with fewer --steps",
            (*RESUME, "--steps", "1"),
            ("--steps 1", "step 2"),
            run_copy(),
        ),  # fmt: skip
        Case("resume with --steps -1", (*RESUME, "--steps", "-1"), ("--steps",), run_copy()),
        Case(
            "resume with --ckpt-every 0",
            (*RESUME, "--ckpt-every", "0"),
            ("--ckpt-every",),
            run_copy(),
        ),  # fmt: skip
        Case(
            "resume a tokens run with --steps",
            (*RESUME, "--steps", "9"),
            ("--tokens 96",),
            run_copy("tokens"),
        ),  # fmt: skip
        Case("resume with --nproc 0", (*RESUME, "--nproc", "0"), ("--nproc",), run_copy()),
        Case(
            "sft resume of a pretraining run",
            ("sft", "--resume", "{root}/run"),
            ("holds a pretrain run", "euler train --resume"),
            run_copy(),
        ),  # fmt: skip
        Case(
            "train resume of an sft run",
            RESUME,
            ("holds a sft run", "euler sft --resume"),
            run_copy("sft"),
        ),  # fmt: skip
        Case(
            "sft resume with --checkpoint",
            ("sft", "--resume", "{root}/run", "--checkpoint", "{root}/run"),
            ("--checkpoint",),
            run_copy("sft"),
        ),  # fmt: skip
        # --resume: a checkpoint that is not this run's
        Case(
            "resume another run's checkpoint",
            RESUME,
            ("state.run_id", "another run's"),
            run_copy("pre", foreign_checkpoint),
        ),  # fmt: skip
        Case(
            "resume a checkpoint without run id",
            RESUME,
            ("state.run_id", "nothing"),
            run_copy("pre", lambda run: resave_checkpoint(run, drop_run_id=True)),
        ),  # fmt: skip
        Case(
            "resume a weights-only checkpoint",
            RESUME,
            ("weights only",),
            run_copy("pre", lambda run: resave_checkpoint(run, weights_only=True)),
        ),  # fmt: skip
        Case(
            "resume a weights-only checkpoint without a run id",
            RESUME,
            ("--resume", "weights only"),
            run_copy("pre", lambda run: resave_checkpoint(run, True, drop_run_id=True)),
        ),  # fmt: skip
        Case(
            "chat --speculative --temperature 0.8",
            (*CHAT, "--speculative", "--temperature", "0.8"),
            ("--speculative", "--temperature"),
        ),
        Case(
            "chat --speculative --temperature 1",
            (*CHAT, "--temperature", "1", "--speculative"),
            ("--speculative", "--temperature"),
        ),
        # chat: every flag checked before the checkpoint is read
        Case("chat --max-tokens 0", (*CHAT, "--max-tokens", "0"), ("--max-tokens",)),
        Case("chat --max-tokens -1", (*CHAT, "--max-tokens", "-1"), ("--max-tokens",)),
        Case("chat --max-tokens abc", (*CHAT, "--max-tokens", "abc"), ("--max-tokens",)),
        Case("chat --temperature -1", (*CHAT, "--temperature", "-1"), ("--temperature",)),
        Case("chat --temperature nan", (*CHAT, "--temperature", "nan"), ("--temperature",)),
        Case("chat --temperature inf", (*CHAT, "--temperature", "inf"), ("--temperature",)),
        Case(
            "chat --temperature -1 speculative",
            (*CHAT, "--temperature", "-1", "--speculative"),
            ("--temperature",),
        ),  # fmt: skip
        Case("chat --top-p 0", (*CHAT, "--top-p", "0"), ("--top-p",)),
        Case("chat --top-p 1.5", (*CHAT, "--top-p", "1.5"), ("--top-p",)),
        Case("chat --top-p nan", (*CHAT, "--top-p", "nan"), ("--top-p",)),
        Case("chat --top-k -1", (*CHAT, "--top-k", "-1"), ("--top-k",)),
        Case("chat --seed -1", (*CHAT, "--seed", "-1"), ("--seed",)),
        Case("chat --device tpu", (*CHAT, "--device", "tpu"), ("--device",)),
        Case("chat --prompt empty", (*CHAT, "--prompt", ""), ("--prompt",)),
        Case(
            "chat checkpoint missing",
            ("chat", "--checkpoint", "{root}/none.safetensors"),
            ("{root}/none.safetensors", "not found"),
        ),  # fmt: skip
        Case(
            "chat a folder without checkpoint", ("chat", "--checkpoint", "{root}"), ("not found",)
        ),  # fmt: skip
        Case(
            "chat a text file",
            ("chat", "--checkpoint", "{root}/f.txt", "--prompt", "x"),
            ("{root}/f.txt", "not a checkpoint"),
            a_file("f.txt"),
        ),  # fmt: skip
        # plot
        Case("plot nowhere", ("plot", "--checkpoint", "{root}/nowhere"), ("no metrics to plot",)),
        Case(
            "plot a file",
            ("plot", "--checkpoint", "{root}/f.txt"),
            ("{root}/f.txt", "is a file"),
            a_file("f.txt"),
        ),
        Case("plot no arguments", ("plot",), ("give --checkpoint RUN",)),
        Case(
            "plot empty metrics",
            ("plot", "--checkpoint", "{root}/run"),
            ("no training steps",),
            metrics(""),
        ),
        Case(
            "plot a broken line",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "invalid JSON"),
            metrics("{oops\n" + GOOD_STEP),
        ),  # fmt: skip
        Case(
            "plot a list line",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:2", "a JSON object"),
            metrics(GOOD_STEP + "[1, 2]\n"),
        ),  # fmt: skip
        Case(
            "plot loss a string",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "loss", "'low'"),
            metrics(GOOD_STEP.replace("5.0", '"low"')),
        ),  # fmt: skip
        Case(
            "plot no step",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "step", "missing"),
            metrics(GOOD_STEP.replace('"step": 1, ', "")),
        ),  # fmt: skip
        Case(
            "plot steps going back",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:2", "step"),
            metrics(GOOD_STEP + GOOD_STEP),
        ),  # fmt: skip
        Case(
            "plot NaN",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "NaN"),
            metrics(GOOD_STEP.replace("5.0", "NaN")),
        ),  # fmt: skip
        Case(
            "plot not utf-8",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "UTF-8"),
            metrics(b'{"step": "\xff"}\n' + GOOD_STEP.encode()),
        ),  # fmt: skip
        Case(
            "plot an unknown record",
            ("plot", "--checkpoint", "{root}/run"),
            ("metrics.jsonl:1", "val_loss"),
            metrics('{"step": 1}\n'),
        ),  # fmt: skip
        Case(
            "plot --out not png",
            ("plot", "--checkpoint", "{root}/run", "-o", "{root}/run/metrics.jsonl"),
            ("--out", ".png"),
            metrics(GOOD_STEP),
        ),  # fmt: skip
        Case(
            "plot --out folder missing",
            ("plot", "--checkpoint", "{root}/run", "-o", "{root}/no/x.png"),
            ("--out", "{root}/no", "not found"),
            metrics(GOOD_STEP),
        ),  # fmt: skip
        Case(
            "plot --out a folder",
            ("plot", "--checkpoint", "{root}/run", "-o", "{root}/d.png"),
            ("--out", "is a folder"),
            lambda root: (metrics(GOOD_STEP)(root), (root / "d.png").mkdir()),
        ),  # fmt: skip
    ]
)


def test_there_are_enough_cases():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case, data_root, tmp_path, monkeypatch, capsys):
    assert_refused(monkeypatch, capsys, case, tmp_path / "case", data=str(data_root),
                   ck=str(RUNS["sft"]))  # fmt: skip


# ---------------------------------------------------------------------------- what is accepted


def _losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run) if "loss" in r]


def test_resume_with_a_longer_steps_continues_and_records_it(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(RUNS["pre"], run)
    (run / ".lock").write_text("12345\n")  # left by a run that was killed: nobody holds it
    code, out, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run), "--steps", "4",
                             "--ckpt-every", "1", "--log-every", "1")  # fmt: skip
    assert code == 0, err
    assert f"resuming {run} at step 2" in out and "step 4/4" in out
    assert checkpoint.load(run).step == 4 and [s for s, _ in _losses(run)] == [1, 2, 3, 4]
    saved = json.loads((run / "run.json").read_text())
    assert saved["train"]["steps"] == 4 and saved["train"]["ckpt_every"] == 1
    assert saved["run_id"] == json.loads((RUNS["pre"] / "run.json").read_text())["run_id"]
    assert not (run / ".lock").exists()  # let go at the end


def test_a_diverging_run_keeps_the_newest_checkpoint_whose_loss_was_finite(
    data_root, tmp_path, monkeypatch, capsys
):
    """A huge learning rate at optimizer step 4 (0-based 3) wrecks the parameters, but the
    loss of step 4 (of the parameters before it) is finite: the checkpoint due after step 4
    must not be written. Step 5's loss is not finite: the run stops in one line, exit 2,
    keeping step 2's checkpoint, and resumed from it (the schedule repaired) it trains on."""
    real_lr_at = train_mod.lr_at

    def wrecking(step, tc, total):
        return 1e30 if step == 3 else real_lr_at(step, tc, total)

    monkeypatch.setattr(train_mod, "lr_at", wrecking)
    run = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--data", str(data_root / "pre"), "--out", str(run),
            "--batch-size", "2", "--steps", "8", "--ckpt-every", "2", "--eval-every", "8",
            "--eval-batches", "1", "--sample-tokens", "0", "--warmup-steps", "1"]  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert "is nan at step 5" in err or "is inf at step 5" in err, err
    assert "whose loss was finite (step 2)" in err
    assert checkpoint.load(run).step == 2
    assert not list(run.glob(".*.tmp"))
    monkeypatch.setattr(train_mod, "lr_at", real_lr_at)
    code, out, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run))
    assert code == 0, err
    assert checkpoint.load(run).step == 8
    assert all(math.isfinite(loss) for _, loss in _losses(run))


def test_a_killed_saves_temporary_files_go_on_resume_and_on_a_fresh_start(
    data_root, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    shutil.copytree(RUNS["pre"], run)
    stale = [run / ".checkpoint.safetensors.x1y2.tmp", run / ".run.json.abc.tmp",
             run / ".metrics.jsonl.q.tmp"]  # fmt: skip
    for path in stale:
        path.write_bytes(b"half a file")
    (run / "notes.txt").write_text("mine")  # not the run's: stays
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run))
    assert code == 0, err
    assert not any(p.exists() for p in stale) and (run / "notes.txt").exists()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".tokenizer.json.zz.tmp").write_text("{")
    tc = tiny_config(fresh, data_root / "pre", steps=1, sample_tokens=0)
    train(tc)
    assert not list(fresh.glob(".*.tmp"))


def test_a_full_disk_while_logging_is_one_line_and_keeps_the_checkpoint(
    data_root, tmp_path, monkeypatch, capsys
):
    """metrics.jsonl cannot grow at step 3: the run stops naming it; the checkpoint of
    step 2 is the one on disk, and it loads."""

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            if '"step": 3, "loss"' in text:
                raise OSError(28, "No space left on device")
            return self.f.write(text)

        def flush(self):
            self.f.flush()

        def close(self):
            self.f.close()

    real_set_up = train_mod._set_up

    def set_up(*args):
        r = real_set_up(*args)
        r.metrics = FullDisk(r.metrics)
        return r

    monkeypatch.setattr(train_mod, "_set_up", set_up)
    run = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--data", str(data_root / "pre"), "--out", str(run),
            "--batch-size", "2", "--steps", "6", "--ckpt-every", "2", "--eval-every", "6",
            "--eval-batches", "1", "--sample-tokens", "0"]  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert f"could not append to {run / 'metrics.jsonl'}: No space left on device" in err
    assert "(step 2)" in err and checkpoint.load(run).step == 2


def test_sampling_refuses_logits_that_are_not_finite():
    from euler.errors import EulerError
    from euler.inference.sampling import SamplingConfig, greedy, sample

    rng = np.random.default_rng(0)
    for bad in (np.nan, np.inf, -np.inf):
        logits = np.array([0.5, bad, 1.0], np.float32)
        for sc in (SamplingConfig(0.0), SamplingConfig(0.8), SamplingConfig(1.0, 0, 1.0)):
            with pytest.raises(EulerError, match="logits hold"):
                sample(logits, sc, rng)
        with pytest.raises(EulerError, match="logits hold"):
            greedy(np.stack([logits, logits]))
    assert sample(np.array([0.0, 3.0, 1.0]), SamplingConfig(0.0), rng) == 1
    assert greedy(np.array([[0.0, 3.0], [2.0, 1.0]])).tolist() == [1, 0]


def test_chat_of_a_broken_checkpoint_is_one_line(tmp_path, monkeypatch, capsys):
    """Weights that overflow: the logits are not finite, and chat says so in one line."""
    ck = checkpoint.load(RUNS["sft"])
    path = tmp_path / "big.safetensors"
    checkpoint.save(path, ck.cfg, np.full_like(ck.params, 3e38), None, ck.state,
                    ck.train_config, ck.tokenizer_json)  # fmt: skip
    for extra in ([], ["--speculative"]):
        args = ["--prompt", "Say sun twice.", "--max-tokens", "3", *extra]
        code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(path), *args)
        assert code == 2 and err.startswith("error: the model's logits hold"), err
        assert err.count("\n") == 1
