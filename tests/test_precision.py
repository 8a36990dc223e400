"""bf16 storage and the per-tensor table: rounding, widening, and the docs kept in step."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

from euler.errors import EulerError
from euler.layer_math import bf16_round, bf16_widen
from euler.model.config import get_preset
from euler.model.transformer import Activations, _ByteCounter
from euler.precision import (
    BF16,
    BF16_NAMES,
    FP32_TENSORS,
    check_precision,
    from_bf16,
    round_bf16,
    tensor_table,
    to_bf16,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "gpu.md"


def special_values() -> np.ndarray:
    """Random magnitudes over the whole range, every halfway case of 4096 bf16 values (odd
    and even kept bits), the largest finite floats, subnormals, zeros, infinities, NaNs."""
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(20000) * 10.0 ** rng.integers(-40, 39, 20000)
    halfway = ((np.arange(4096, dtype=np.uint32) << 16) | 0x8000).view(np.float32)
    edges = np.array([3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.2e-38, 0.0, -0.0,
                      np.inf, -np.inf, np.nan], np.float32)  # fmt: skip
    return np.concatenate([wide.astype(np.float32), halfway, -halfway, edges])


def test_to_bf16_rounds_to_nearest_even_as_exact_arithmetic_says():
    """Against a float64 reference: the nearest of the two bf16 neighbours (found by
    truncation and one step up), ties to the even bit pattern; NaN to the quiet NaN."""
    x = special_values()
    finite = np.isfinite(x)
    lo = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # toward zero
    hi_bits = (lo.view(np.uint32) + np.uint32(0x10000)).astype(np.uint32)
    hi = hi_bits.view(np.float32)  # the next bf16 away from zero (inf past the largest)
    # IEEE rounds as if the exponent were unbounded, then overflows: past the largest
    # finite bf16 the upper neighbour is 2^128, which becomes inf
    hi64 = np.where(
        np.isinf(hi), np.copysign(2.0**128, x.astype(np.float64)), hi.astype(np.float64)
    )
    with np.errstate(invalid="ignore"):
        d_lo = np.abs(x.astype(np.float64) - lo)
        d_hi = np.abs(hi64 - x)
    even_lo = (lo.view(np.uint32) >> 16) % 2 == 0
    want = np.where((d_lo < d_hi) | ((d_lo == d_hi) & even_lo), lo, hi)
    got = from_bf16(to_bf16(x))
    np.testing.assert_array_equal(got[finite], want[finite])
    assert np.all(to_bf16(x)[np.isnan(x)] == 0x7FC0)
    assert np.all(got[np.isinf(x)] == x[np.isinf(x)])


def test_kernel_rounding_equals_numpys_for_every_value():
    """layer_math's bf16_round / bf16_widen (compiled, as the kernels use them) against
    to_bf16 / from_bf16 on the values above and on all 65,536 bit patterns."""

    @numba.njit
    def narrow(x, out):
        for i in range(x.size):
            out[i] = bf16_round(x[i])

    @numba.njit
    def widen(b, out):
        for i in range(b.size):
            out[i] = bf16_widen(b[i])

    x = special_values()
    bits = np.empty(x.size, BF16)
    narrow(x, bits)
    np.testing.assert_array_equal(bits, to_bf16(x))
    every = np.arange(65536, dtype=np.uint32).astype(BF16)
    wide = np.empty(every.size, np.float32)
    widen(every, wide)
    np.testing.assert_array_equal(wide.view(np.uint32), from_bf16(every).view(np.uint32))
    assert np.array_equal(round_bf16(wide[np.isfinite(wide)]), wide[np.isfinite(wide)])


def test_the_table_names_every_activation_and_the_docs_show_it():
    """Each Activations buffer is bf16 or float32 by the table, none unnamed; docs/gpu.md
    holds tensor_table() verbatim."""
    fp32 = {n for names, _ in FP32_TENSORS for n in names.split(", ")}
    assert not fp32 & BF16_NAMES
    acts = Activations(get_preset("tiny"), _ByteCounter(), np.float32, 2, 8, "bf16")
    buffers = set(vars(acts)) - {"B", "T", "tokens", "targets"}
    assert buffers == (BF16_NAMES | fp32) - {"params_lp", "params", "grads", "m", "v"}
    assert tensor_table() in DOCS.read_text()


def test_unknown_precision_lists_the_choices():
    with pytest.raises(EulerError, match=r"--precision: 'fp16' is not one of fp32, tf32, bf16"):
        check_precision("fp16")


def test_bf16_gpu_training_needs_whole_attention_tiles():
    """The GPU's bf16 attention backward takes T in whole 64-row tiles: a bf16 cuda run of
    another length is refused naming the flag (the trainer and bench ask before any step)."""
    from euler.precision import check_bf16_sequence

    with pytest.raises(EulerError, match=r"--seq-len 100: .* multiple of 64 .*--precision tf32"):
        check_bf16_sequence("cuda", "bf16", 100)
    check_bf16_sequence("cuda", "bf16", 512)
    check_bf16_sequence("cpu", "bf16", 100)  # the emulation takes any length
    check_bf16_sequence("cuda", "tf32", 100)
