"""bf16 <-> float32 on the CPU: the emulation's conversions, as prange kernels.

The same rounding as the GPU's stores (layer_math.bf16_round, bf16_widen) over flat arrays;
NumPy's version (euler.precision.to_bf16) builds several 64-bit temporaries and took a
fifth of an emulated `small` step.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from euler.layer_math import bf16_round, bf16_widen


@njit(parallel=True, cache=True)
def _widen(out, bits):
    for i in prange(bits.size):
        out[i] = bf16_widen(bits[i])


@njit(parallel=True, cache=True)
def _narrow(out, x):
    for i in prange(x.size):
        out[i] = bf16_round(x[i])


def widen(bits: np.ndarray) -> np.ndarray:
    """A new float32 array of the values of bf16 bits (uint16, any shape, C-contiguous)."""
    out = np.empty(bits.shape, np.float32)
    _widen(out.reshape(-1), np.ascontiguousarray(bits).reshape(-1))
    return out


def narrow_into(bits: np.ndarray, x: np.ndarray) -> None:
    """bits[...] = x rounded to bf16 (nearest even), bits a C-contiguous uint16 array."""
    _narrow(bits.reshape(-1), np.ascontiguousarray(x, dtype=np.float32).reshape(-1))
