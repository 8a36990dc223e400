"""The CPU row helpers of euler/layer_math.py against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from euler.layer_math import max_row


@njit(cache=False)
def _max_row(row, n):
    return max_row(row, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_row_equals_numpys_at_every_length(dtype):
    rng = np.random.default_rng(0)
    row = rng.standard_normal(300).astype(dtype)
    row[137] = 9.0  # past the first vectors: the largest where only a full-width pass finds it
    for n in (*range(1, 70), 136, 137, 138, 300):
        assert _max_row(row, n) == row[:n].max(), n


def test_max_row_skips_nan_and_keeps_infinities():
    row = np.array([-np.inf, 1.0, np.nan, 3.0, -2.0] * 8, np.float32)
    assert _max_row(row, row.size) == 3.0
    row[17] = np.inf
    assert _max_row(row, row.size) == np.inf
    assert np.isnan(_max_row(np.full(33, np.nan, np.float32), 33))
