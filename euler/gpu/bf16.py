"""bf16 values in kernels, chosen by type when a kernel compiles.

    widen(x)         x as float32 where x is bf16 bits (uint16), else x itself
    stored(ary, x)   x as ary stores it: rounded to bf16 bits for a bf16 array, else x

One scalar kernel then serves float32 and bf16 tensors alike: for float32 both are the
identity and compile to nothing. The 16-byte kernels use vector.py's bf16 loads and stores
instead. In the CUDA simulator (kernels run as Python) the plain functions run.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from euler.layer_math import bf16_round, bf16_widen


def widen(x):
    """x as float32: bf16 bits widened, any other value as it is (the simulator runs this)."""
    return bf16_widen(x) if isinstance(x, np.uint16) else x


@overload(widen, target="cuda")
def _widen_overload(x):
    if x == types.uint16:
        return lambda x: bf16_widen(x)
    return lambda x: x


def stored(ary, x):
    """x as an element of ary: bf16 bits (nearest even) for a uint16 array, else x (the
    simulator runs this)."""
    return bf16_round(x) if ary.dtype == np.uint16 else x


@overload(stored, target="cuda")
def _stored_overload(ary, x):
    if ary.dtype == types.uint16:
        return lambda ary, x: bf16_round(x)
    return lambda ary, x: x
