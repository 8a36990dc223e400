"""CPU backend: @njit(parallel=True) prange kernels; matrix products go to BLAS via NumPy."""
