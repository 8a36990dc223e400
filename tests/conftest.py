"""Session hooks: the background runs start with the session (or as soon as collection has
picked their tests), so that their minutes overlap the rest of the session on the other core.

A test marked `background_run(file, marks, simulator)` reports a pytest subprocess that runs
the file's tests selected by `-m marks` with EULER_TEST_BACKGROUND=1 (the file's own tests
read it: the session's copy of the file holds only the reporting tests); its fixture
`background_run_result` waits for it. Two kinds use this:
- simulator=True: the CUDA-simulator suites. NUMBA_ENABLE_CUDASIM must be set before
  numba.cuda is first imported, so they need a process of their own anyway (the simulator
  runs one Python thread per GPU thread, its block scheduler replaced by
  simulator_scheduler.py's).
- simulator=False: the sm_90 PTX compiles, a minute or two of NVVM on one core.

The four background runs take about 300 s of CPU (measured on the 2-core machine): they
run at the lowest priority, so the session (the longest chain) keeps a core, and their
reporting tests come last, so the session waits for them only at its end. A default
selection over their files (`-m 'not slow'`, no `-k`) starts the runs of EARLY_RUNS when the
session starts, not when collection ends: collecting imports torch, hypothesis and more for
about 15 s while the other core would idle. A run that collection then does not pick is
stopped. A default selection of the whole folder also starts tests/prewarm.py, at normal
priority: it compiles kernels the session needs only later into Numba's cache, and
test_background_runs.py's last test reports it.
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
# (file under the repository, marks, simulator) of the runs a default selection reports
EARLY_RUNS = (
    ("tests/test_gpu_sim.py", "", True),
    ("tests/test_gpu_ptx.py", "not slow", False),
    ("tests/test_gpu_tc.py", "not slow", False),
    ("tests/test_gpu_tc.py", "not slow", True),
)
_RUNS: dict[str, tuple[subprocess.Popen, object]] = {}  # nodeid -> (process, its output)
_EARLY: dict[tuple[str, str, bool], tuple[subprocess.Popen, object]] = {}  # started, unclaimed
_PREWARM: list[tuple[subprocess.Popen, object]] = []  # tests/prewarm.py, when started

IN_BACKGROUND = os.environ.get("EULER_TEST_BACKGROUND") == "1"

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from simulator_scheduler import install

    install()


def _run_key(file: str, marks: str, simulator: bool) -> tuple[str, str, bool]:
    return str(Path(file).resolve().relative_to(ROOT)), marks, simulator


def _launch(file: str, marks: str, simulator: bool) -> tuple[subprocess.Popen, object]:
    """Start `pytest -m marks file` in a niced subprocess; (process, its output file)."""
    # without hypothesis's plugin: no background suite uses it, and its import costs seconds
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:hypothesispytest"]
    cmd += ["-m", marks] if marks else []
    cmd += [str(Path(file))]
    env = dict(os.environ, EULER_TEST_BACKGROUND="1")
    env["NUMBA_ENABLE_CUDASIM"] = "1" if simulator else "0"
    # niced: the session is the longest chain of tests, so it keeps a core while the
    # background runs share what is left (at nice 5 the four together outweighed it)
    return _popen(cmd, env, BACKGROUND_NICE)


def _popen(cmd: list[str], env: dict, nice: int) -> tuple[subprocess.Popen, object]:
    """Start cmd in the repository at the given niceness; (process, its output file)."""
    out = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nobody reads it until the end
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=lambda: os.nice(nice))  # fmt: skip
    return proc, out


def _in_background() -> bool:
    return IN_BACKGROUND or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    """When the selection is the default: start EARLY_RUNS under the session's paths, and
    the prewarm when the paths hold the whole tests folder."""
    opt = session.config.option
    if _in_background() or opt.collectonly or opt.markexpr != "not slow" or opt.keyword:
        return
    paths = [Path(a) for a in session.config.args]
    if any("::" in str(p) for p in paths):
        return
    paths = [p.resolve() for p in paths]
    if any(p in (ROOT, ROOT / "tests") for p in paths):
        _PREWARM.append(_popen([sys.executable, "-m", "tests.prewarm"], dict(os.environ), 0))
    for key in EARLY_RUNS:
        file = ROOT / key[0]
        if any(p == file or p in file.parents for p in paths):
            _EARLY[key] = _launch(str(file), *key[1:])


def _start(item: pytest.Item) -> None:
    """Bind the item to its run: the one started early, or a new one."""
    marker = item.get_closest_marker("background_run")
    if marker is None or _in_background():
        return
    early = _EARLY.pop(_run_key(*marker.args), None)
    _RUNS[item.nodeid] = early or _launch(*marker.args)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "background_run(file, marks, simulator): reports a pytest run of file in a subprocess",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The reporting tests of the background runs and of the prewarm last, in their order."""

    def reports(item: pytest.Item) -> bool:
        marked = item.get_closest_marker("background_run") is not None
        return marked or "prewarm_result" in getattr(item, "fixturenames", ())

    items.sort(key=reports)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for item in session.items:
        _start(item)
    _stop(_EARLY.values())  # started early, but collection did not pick their tests
    _EARLY.clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # runs whose test never came (an earlier -x stop), or early ones when collection failed
    _stop([*_RUNS.values(), *_EARLY.values(), *_PREWARM])


def _stop(runs) -> None:
    for proc, out in runs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()


@pytest.fixture
def background_run_result(request: pytest.FixtureRequest) -> tuple[int, str]:
    """(exit status, the last 8,000 characters of output) of the test's background run."""
    return _result(*_RUNS[request.node.nodeid])


def _result(proc: subprocess.Popen, out) -> tuple[int, str]:
    """Wait for proc (killed after TIMEOUT_S); (exit status, the end of its output)."""
    try:
        rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    out.seek(0)
    return rc, out.read()[-8000:]


@pytest.fixture
def prewarm_result() -> tuple[int, str]:
    """(exit status, the last 8,000 characters of output) of tests/prewarm.py's run;
    skips when this session did not start one."""
    if not _PREWARM:
        pytest.skip("no prewarm in this session: it starts with a default run of the folder")
    proc, out = _PREWARM[0]
    return _result(proc, out)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A small prepared data folder (tests/train_helpers.build_data), built once a module."""
    from tests.train_helpers import build_data

    return build_data(tmp_path_factory)


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> None:
    """EULER_CACHE in the test's own folder, so no test reads another's cached corpus."""
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
