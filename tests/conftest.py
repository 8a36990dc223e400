"""Session hooks: the background runs start as soon as collection has picked their tests,
so that their minutes overlap the rest of the session on the other core.

A test marked `background_run(file, marks, simulator)` reports a pytest subprocess that runs
the file's tests selected by `-m marks` with EULER_TEST_BACKGROUND=1 (the file's own tests
read it: the session's copy of the file holds only the reporting tests); its fixture
`background_run_result` waits for it. Two kinds use this:
- simulator=True: the CUDA-simulator suites. NUMBA_ENABLE_CUDASIM must be set before
  numba.cuda is first imported, so they need a process of their own anyway (the simulator
  runs one Python thread per GPU thread, its block scheduler replaced by
  simulator_scheduler.py's).
- simulator=False: the sm_90 PTX compiles, a minute or two of NVVM on one core.

The four background runs take about 400 s of CPU (measured on the 2-core machine): they
run at the lowest priority, so the session (the longest chain) keeps a core, and their
reporting tests come last, so the session waits for them only at its end.
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
BACKGROUND_NICE = 19
_RUNS: dict[str, tuple[subprocess.Popen, object]] = {}  # nodeid -> (process, its output)

IN_BACKGROUND = os.environ.get("EULER_TEST_BACKGROUND") == "1"

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from simulator_scheduler import install

    install()


def _start(item: pytest.Item) -> None:
    marker = item.get_closest_marker("background_run")
    if marker is None or IN_BACKGROUND or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return
    file, marks, simulator = marker.args
    # without hypothesis's plugin: no background suite uses it, and its import costs seconds
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:hypothesispytest"]
    cmd += ["-m", marks] if marks else []
    cmd += [str(Path(file))]
    out = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nobody reads it until the end
    env = dict(os.environ, EULER_TEST_BACKGROUND="1")
    env["NUMBA_ENABLE_CUDASIM"] = "1" if simulator else "0"
    # niced: the session is the longest chain of tests, so it keeps a core while the
    # background runs share what is left (at nice 5 the four together outweighed it)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=lambda: os.nice(BACKGROUND_NICE))  # fmt: skip
    _RUNS[item.nodeid] = (proc, out)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "background_run(file, marks, simulator): reports a pytest run of file in a subprocess",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The background runs' reporting tests last, in their order."""
    items.sort(key=lambda item: item.get_closest_marker("background_run") is not None)


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
def background_run_result(request: pytest.FixtureRequest) -> tuple[int, str]:
    """(exit status, the last 8,000 characters of output) of the test's background run."""
    proc, out = _RUNS[request.node.nodeid]
    try:
        rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    out.seek(0)
    return rc, out.read()[-8000:]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A small prepared data folder (tests/train_helpers.build_data), built once a module."""
    from tests.train_helpers import build_data

    return build_data(tmp_path_factory)


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> None:
    """EULER_CACHE in the test's own folder, so no test reads another's cached corpus."""
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
