"""The CPU's dense attention (short sequences, BLAS score blocks) against FlashAttention."""

from __future__ import annotations

import numpy as np
import pytest

from euler.cpu.attention_dense import DENSE_MAX_T
from euler.cpu.backend import CpuBackend
from tests import numpy_reference as ref


def _both(B, T, H, G, E, dtype, seed=0):
    """(out, lse, dqkv) from the dense path and from FlashAttention, on the same inputs."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(dtype)
    dout = rng.standard_normal((B, T, H * E)).astype(dtype)
    results = []
    for be in (CpuBackend(), CpuBackend(attention_tile=16)):
        out, lse = np.full((B, T, H * E), np.nan, dtype), np.full((B, H, T), np.nan, dtype)
        dqkv = np.full_like(qkv, np.nan)
        be.attention_forward(out, lse, qkv, H, G, E)
        be.attention_backward(dqkv, dout, qkv, out, lse, H, G, E)
        results.append((out, lse, dqkv))
    return qkv, results


@pytest.mark.parametrize(
    "B, T, H, G, E",
    [(2, 70, 6, 2, 8), (3, 33, 4, 4, 4), (1, 1, 2, 1, 2), (5, 17, 4, 1, 16)],
)
def test_dense_attention_equals_flash_attention(B, T, H, G, E):
    """float64: forward and every gradient equal FlashAttention's to rounding."""
    _, (dense, flash) = _both(B, T, H, G, E, np.float64)
    for name, d, f in zip(("out", "lse", "dqkv"), dense, flash, strict=True):
        np.testing.assert_allclose(d, f, rtol=0, atol=1e-12 * np.abs(f).max(), err_msg=name)


def test_dense_attention_float32_and_naive():
    B, T, H, G, E = 4, 128, 4, 2, 32  # the `small` shapes
    qkv, (dense, flash) = _both(B, T, H, G, E, np.float32, seed=1)
    for d, f in zip(dense, flash, strict=True):
        assert np.abs(d - f).max() <= 1e-5 * np.abs(f).max()
    q = qkv[..., : H * E].reshape(B, T, H, E).astype(np.float64)
    k = qkv[..., H * E : (H + G) * E].reshape(B, T, G, E).astype(np.float64)
    v = qkv[..., (H + G) * E :].reshape(B, T, G, E).astype(np.float64)
    want = ref.naive_attention(q, k, v)
    np.testing.assert_allclose(dense[0].reshape(B, T, H, E), want, atol=1e-5)


def test_backend_picks_dense_only_for_short_sequences_without_a_tile():
    assert CpuBackend().dense_max_t == DENSE_MAX_T
    assert CpuBackend(attention_tile=64).dense_max_t == 0  # a tile asks for FlashAttention
