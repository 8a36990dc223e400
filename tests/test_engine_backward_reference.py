"""The CPU engine's layer backward passes against the NumPy twins, in float64.

Both sides are float64, so they agree to rounding: a wrong term in a kernel's chain rule
(or in the twin: tests/test_numpy_reference.py checks the twins against finite
differences) shows as an O(1) relative error. Attention runs dense (whole score blocks) and
in FlashAttention tiles of 4 keys, so that the 9 positions span 3 tiles, the last partial.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from backward_twins import BACKWARD_CHECKS, check_attention_backward

from euler.cpu.backend import CpuBackend

SIZES = SimpleNamespace(B=2, T=9, D=12, F=10, V=17, H=4, G=2, E=6, K=3)
RTOL, ATOL = 1e-10, 1e-12


@pytest.mark.parametrize("check", BACKWARD_CHECKS, ids=lambda f: f.__name__[6:])
def test_cpu_backward_matches_numpy_twin(check) -> None:
    check(CpuBackend(), np.random.default_rng(30), np.float64, SIZES, RTOL, ATOL)


@pytest.mark.parametrize("H,G", [(4, 2), (3, 3), (4, 1)])
def test_cpu_flash_attention_backward_matches_numpy_twin(H: int, G: int) -> None:
    sizes = SimpleNamespace(**{**vars(SIZES), "H": H, "G": G})
    be = CpuBackend(attention_tile=4)
    assert be.dense_max_t < sizes.T  # the tiled path, not the dense one
    check_attention_backward(be, np.random.default_rng(31), np.float64, sizes, RTOL, ATOL)
