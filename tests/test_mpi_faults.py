"""One rank of a 2-process CPU run (`euler train --nproc 2`) killed mid-run: the launcher
says so in one line on stderr (not MPICH's ten-line banner), exits with status 2, and the
run folder holds a whole checkpoint that loads and resumes. Skipped without mpi4py."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from euler.training import checkpoint
from tests.train_helpers import build_data

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py and mpiexec"
)


def _rank_pid(rank: int, out: Path) -> int | None:
    """The PID of the rank `rank` training into out (found by its environment)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmdline and f"PMI_RANK={rank}".encode() in env:
            return int(proc.name)
    return None


def test_a_killed_rank_is_one_line_and_the_checkpoint_is_whole(tmp_path_factory):
    data = build_data(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("mpi-kill")
    out = tmp / "run"
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "euler.cli", "train", "--data", str(data / "pre"), "--out",
           str(out), "--preset", "tiny", "--batch-size", "4", "--steps", "1000000",
           "--ckpt-every", "5", "--eval-every", "1000000", "--log-every", "1000",
           "--nproc", "2"]  # fmt: skip
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (out / checkpoint.CHECKPOINT_NAME).exists():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.5)
        time.sleep(1.0)  # a few more checkpoints: the kill lands anywhere in a step
        pid = _rank_pid(1, out)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    lines = stderr.strip().splitlines()
    assert launcher.returncode == 2, stdout + stderr
    assert len(lines) == 1 and lines[0].startswith("error: a rank (PID "), stderr
    assert "Killed" in lines[0] and f"--resume {out} continues" in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr and "BAD TERMINATION" not in stdout + stderr
    ck = checkpoint.load(out)  # whole: written atomically, whenever the kill came
    assert ck.step > 0 and ck.step % 5 == 0
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp")]
