"""NanoEuler: a small Llama-style language model with hand-written Numba kernels."""

from euler.cache import use_private_numba_cache

__version__ = "0.1.0"

use_private_numba_cache()
