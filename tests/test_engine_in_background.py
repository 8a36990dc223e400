"""The CPU engine's test files, run beside the session (conftest.py): their kernels take a
cold session minutes of Numba compiling on one core."""

from __future__ import annotations

from tests.background import background_test

test_engine_files_in_background = background_test(
    ("tests/test_engine.py", "tests/test_engine_attention_dense.py"),
    "",
    False,
    "tests/test_engine.py and tests/test_engine_attention_dense.py in a subprocess.",
    needs_cuda=False,
)
