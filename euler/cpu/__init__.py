"""CPU backend: @njit(parallel=True) prange kernels; matrix products are OpenBLAS calls made
from prange blocks (euler/cpu/blas.py), so one pool of threads (Numba's OpenMP) runs
everything and OpenBLAS itself runs single-threaded.

OpenMP's own wait policy is kept (idle threads spin a while, then sleep): a step opens a
parallel region every few hundred microseconds, and waking sleeping threads for each made a
`small` step on 16 cores take 40.1 ms against 32.3 (OMP_WAIT_POLICY=PASSIVE against unset;
docs/cpu.md).

Every kernel compiles with error_model="numpy": under Numba's default ("python") each float
division checks for zero to raise ZeroDivisionError, and that branch stops LLVM vectorising
the loop around it (measured: AdamW 7x slower). A division by zero now gives inf or nan, as
in NumPy; the training loop stops on a non-finite loss.
"""
