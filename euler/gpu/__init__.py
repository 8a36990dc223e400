"""GPU backend: numba.cuda kernels, a ctypes cuBLAS binding and device memory."""
