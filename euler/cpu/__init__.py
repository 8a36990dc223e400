"""CPU backend: @njit(parallel=True) prange kernels; matrix products go to BLAS via NumPy.

A training step alternates prange kernels and multi-threaded BLAS calls on the same cores.
OpenMP threads that spin-wait after a parallel region steal those cores from BLAS (measured
on a 2-core machine: the whole step ran 2-3x slower), so idle OpenMP threads sleep instead,
unless the user chose otherwise. This must happen before the OpenMP runtime loads.

Every kernel compiles with error_model="numpy": under Numba's default ("python") each float
division checks for zero to raise ZeroDivisionError, and that branch stops LLVM vectorising
the loop around it (measured: AdamW 7x slower). A division by zero now gives inf or nan, as
in NumPy; the training loop stops on a non-finite loss.
"""

import os

# remembered so that a benchmark can start a peer process with the environment it would have had
OMP_WAIT_POLICY_SET_HERE = "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
