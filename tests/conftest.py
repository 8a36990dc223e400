"""Session hooks: the CUDA-simulator runs start in the background as soon as collection has
picked their tests, so that their minutes overlap the rest of the session.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the simulator
suites run in pytest subprocesses of their own (the simulator running one Python thread
per GPU thread, its block scheduler replaced by simulator_scheduler.py's). A test marked
`simulator_run(file, marks)` reports such a run of the file's tests selected by `-m marks`:
its fixture `simulator_run_result` waits for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
_RUNS: dict[str, tuple[subprocess.Popen, object]] = {}  # nodeid -> (process, its output)

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from simulator_scheduler import install

    install()


def _start(item: pytest.Item) -> None:
    marker = item.get_closest_marker("simulator_run")
    if marker is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return
    file, marks = marker.args
    # without hypothesis's plugin: no simulator suite uses it, and its import costs seconds
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:hypothesispytest"]
    cmd += ["-m", marks] if marks else []
    cmd += [str(Path(file))]
    out = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nobody reads it until the end
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    _RUNS[item.nodeid] = (proc, out)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "simulator_run(file, marks): reports a CUDA-simulator pytest run of file",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for item in session.items:
        _start(item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc, out in _RUNS.values():  # runs whose test never came (an earlier -x stop)
        if proc.poll() is None:
            proc.kill()
        out.close()


@pytest.fixture
def simulator_run_result(request: pytest.FixtureRequest) -> tuple[int, str]:
    """(exit status, the last 8,000 characters of output) of the test's simulator run."""
    proc, out = _RUNS[request.node.nodeid]
    try:
        rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    out.seek(0)
    return rc, out.read()[-8000:]
