"""conftest.py's early starts: EARLY_RUNS names the default selection's background runs, and
the prewarm (tests/prewarm.py) ran through."""

from __future__ import annotations

import importlib

from tests import conftest


def test_early_runs_are_the_default_selections_background_runs():
    """Every background run that a default selection reports, and no other, is in EARLY_RUNS
    (one left out would only start late; one too many would start and be stopped)."""
    found = set()
    for name in ("test_gpu_sim", "test_gpu_ptx", "test_gpu_tc"):
        for obj in vars(importlib.import_module(f"tests.{name}")).values():
            marks = getattr(obj, "pytestmark", [])
            if any(m.name == "slow" for m in marks):
                continue
            found |= {conftest._run_key(*m.args) for m in marks if m.name == "background_run"}
    assert found == set(conftest.EARLY_RUNS)


def test_the_prewarm_compiled_without_an_error(prewarm_result):
    """tests/prewarm.py, started with the session, ran through: a kernel it names that
    no longer exists or takes other arguments stops it, and the session would compile alone."""
    rc, out = prewarm_result
    assert rc == 0, out
