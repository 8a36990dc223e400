"""GPU backend: numba.cuda kernels, a ctypes cuBLAS binding and device memory.

Numba's NumbaPerformanceWarning ("Grid size 1 will likely result in GPU under-utilization")
is silenced for the process: the small launches it flags (a loss's sum, a norm's partials)
are small by design, and its two lines a launch filled the console of every CUDA run.
"""

import warnings

from numba.core.errors import NumbaPerformanceWarning

warnings.filterwarnings("ignore", category=NumbaPerformanceWarning)
