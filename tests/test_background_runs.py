"""conftest.py's early start: EARLY_RUNS must name the default selection's background runs."""

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
