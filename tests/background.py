"""The session's reporting test of a background run (conftest.py's background_run marker)."""

from __future__ import annotations

import pytest


def background_test(file: str, marks: str, simulator: bool, doc: str):
    """A test that passes when the background run of `file`'s tests selected by `-m marks`
    (in the CUDA simulator if `simulator`) passes, and shows its output when it fails; a
    run of the slow tests is itself marked slow. Bind it to a test_* name in the file."""

    @pytest.mark.background_run(file, marks, simulator)
    def test(background_run_result) -> None:
        pytest.importorskip("numba.cuda")
        rc, out = background_run_result
        assert rc == 0, out

    test.__doc__ = doc
    return pytest.mark.slow(test) if marks == "slow" else test
