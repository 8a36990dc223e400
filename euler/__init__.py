"""NanoEuler: a small Llama-style language model with hand-written Numba kernels."""

from euler.blas_kernels import choose_openblas_kernels

choose_openblas_kernels()  # before NumPy loads OpenBLAS, which reads the choice once

from euler.cache import use_private_numba_cache  # noqa: E402

__version__ = "0.1.0"

use_private_numba_cache()
