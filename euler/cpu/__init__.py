"""CPU backend: @njit(parallel=True) prange kernels; matrix products are OpenBLAS calls made
from prange blocks (euler/cpu/blas.py), so one pool of threads (Numba's OpenMP) runs
everything and OpenBLAS itself runs single-threaded.

OpenMP's own wait policy is kept (idle threads spin a while, then sleep): a step launches a
parallel region every few hundred microseconds, and waking sleeping threads for each cost
16% of a `small` step on 16 cores and 3% on 2 (OMP_WAIT_POLICY=PASSIVE against unset, on
the lent machine's Xeon; bench/labs/cpu_step_profile.py).

Every kernel compiles with error_model="numpy": under Numba's default ("python") each float
division checks for zero to raise ZeroDivisionError, and that branch stops LLVM vectorising
the loop around it (measured: AdamW 7x slower). A division by zero now gives inf or nan, as
in NumPy; the training loop stops on a non-finite loss.
"""
