"""Runs as separate processes: two trainings into one folder, and trainings killed at random.

Two `euler train` processes started together into one folder: exactly one trains, the
other exits with status 2 naming the first's PID. A run that checkpoints every step,
SIGKILLed at a random moment (mid-save, mid-log, holding its lock): the checkpoint left
loads, `--resume` takes the folder over and the finished run's losses are those of a run
never killed. The default run does one round of each; `-m slow` several.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from euler.training import checkpoint
from euler.training.loop import train
from tests.train_helpers import read_metrics, tiny_config

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder

REPO = Path(__file__).resolve().parents[1]
STEPS = 40


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", EULER_CACHE=str(tmp_path / "cache"))  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _train_args(data: Path, run: Path, steps: int) -> list[str]:
    return ["train", "--preset", "tiny", "--data", str(data / "pre"), "--out", str(run),
            "--batch-size", "2", "--steps", str(steps), "--eval-every", str(steps),
            "--eval-batches", "1", "--sample-tokens", "0", "--warmup-steps", "2",
            "--lr", "0.01", "--min-lr", "0.001", "--log-every", "1"]  # fmt: skip


def _euler(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "euler.cli", *args], env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    """Poll until condition() or the process ends; fail after timeout seconds."""
    end = time.monotonic() + timeout
    while not condition() and proc.poll() is None:
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _has_a_step(run: Path) -> bool:
    return (run / "metrics.jsonl").exists() and '"loss"' in (run / "metrics.jsonl").read_text()


# ---------------------------------------------------------------------------- one folder, two runs


def _race(data_root: Path, tmp_path: Path, round_: int) -> None:
    """Two runs into one folder at once: one trains (then Ctrl-C, a checkpoint), one is
    refused naming the other's PID."""
    run = tmp_path / f"race{round_}"
    args = [*_train_args(data_root, run, 100_000), "--ckpt-every", "100000"]
    procs = [_euler(tmp_path, *args), _euler(tmp_path, *args)]
    end = time.monotonic() + 90
    while all(p.poll() is None for p in procs):
        assert time.monotonic() < end, "neither run ended"
        time.sleep(0.02)
    loser = next(p for p in procs if p.poll() is not None)
    winner = next(p for p in procs if p is not loser)
    _, err = loser.communicate()
    assert loser.returncode == 2, err
    assert err == f"error: {run} is in use by another run (PID {winner.pid})\n"
    _wait_for(lambda: _has_a_step(run), winner)
    winner.send_signal(signal.SIGINT)  # finishes its step, saves, exits 130
    out, err = winner.communicate(timeout=60)
    assert winner.returncode == 130, out + err
    assert checkpoint.load(run).step >= 1 and not (run / ".lock").exists()


def test_two_runs_into_one_folder_one_is_refused(data_root, tmp_path):
    _race(data_root, tmp_path, 0)


@pytest.mark.slow
def test_two_runs_into_one_folder_again_and_again(data_root, tmp_path):
    for round_ in range(1, 6):
        _race(data_root, tmp_path, round_)


# ---------------------------------------------------------------------------- SIGKILL


def _kill_at_random(data_root: Path, tmp_path: Path, run: Path, rng: random.Random,
                    in_set_up: bool = False) -> None:  # fmt: skip
    """Carry the run on in a process and SIGKILL it at a random moment: while it trains
    (steps, saves, log lines), or with in_set_up while it sets up holding the lock; the
    checkpoint it leaves, if any, must load."""
    started = time.time()
    proc = _euler(tmp_path, *_continue(data_root, run))
    if in_set_up:
        _wait_for(lambda: _holds_lock(run, proc.pid), proc)
    else:
        _wait_for(lambda: _trains(run, started), proc)
    time.sleep(rng.uniform(0.0, 0.4))
    proc.kill()
    out, err = proc.communicate()
    assert proc.returncode in (0, -signal.SIGKILL), out + err
    if (run / checkpoint.CHECKPOINT_NAME).exists():
        assert 1 <= checkpoint.load(run).step <= STEPS


def _trains(run: Path, since: float) -> bool:
    """Whether a process started at `since` is taking steps: metrics.jsonl, written (or
    trimmed) since then, holds a step."""
    path = run / "metrics.jsonl"
    try:
        return path.stat().st_mtime >= since and '"loss"' in path.read_text()
    except FileNotFoundError:
        return False


def _continue(data_root: Path, run: Path) -> list[str]:
    """The command that carries the run on: --resume once run.json is written, else the
    command that starts it (a kill before run.json leaves nothing to resume)."""
    if (run / "run.json").exists():
        return ["train", "--resume", str(run)]
    return [*_train_args(data_root, run, STEPS), "--ckpt-every", "1"]


def _holds_lock(run: Path, pid: int) -> bool:
    try:
        return (run / ".lock").read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def _killed_runs_resume_exactly(data_root, tmp_path, kills: int) -> None:
    """`kills` SIGKILLs, then --resume to the end: the losses of a run never killed.

    Every run compared is a process of its own, started once this process's run has put
    the kernels in Numba's cache: code loaded from the cache and code compiled fresh for
    the same function are optimised differently (numba/numba#10617), and the row
    reductions, which may be reassociated, then differ in their last bits.
    """
    train(tiny_config(tmp_path / "warm", data_root / "pre", steps=1, eval_batches=1,
                      sample_tokens=0))  # fmt: skip
    whole = tmp_path / "whole"
    _finish(tmp_path, _train_args(data_root, whole, STEPS))
    run, rng = tmp_path / "killed", random.Random(kills)
    for i in range(kills):
        _kill_at_random(data_root, tmp_path, run, rng, in_set_up=i % 3 == 2)
    _finish(tmp_path, _continue(data_root, run))
    assert checkpoint.load(run).step == STEPS
    assert not list(run.glob(".*.tmp")) and not (run / ".lock").exists()
    steps = [(r["step"], r["loss"]) for r in read_metrics(run) if "loss" in r]
    assert steps == [(r["step"], r["loss"]) for r in read_metrics(whole) if "loss" in r]


def _finish(tmp_path: Path, args: list[str]) -> None:
    """Run `euler ARGS` in a process to the end; it must succeed."""
    proc = _euler(tmp_path, *args)
    out, err = proc.communicate()
    assert proc.returncode == 0, out + err


def test_a_killed_run_resumes_exactly(data_root, tmp_path):
    _killed_runs_resume_exactly(data_root, tmp_path, kills=1)


@pytest.mark.slow
def test_a_run_killed_again_and_again_resumes_exactly(data_root, tmp_path):
    _killed_runs_resume_exactly(data_root, tmp_path, kills=6)
