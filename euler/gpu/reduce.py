"""Block-wide reductions for the GPU kernels: warp shuffles, or shared memory in the simulator.

The CUDA simulator has no warp shuffles, so under NUMBA_ENABLE_CUDASIM=1 the same device
functions reduce through shared memory instead (a global constant picks the path, so the
compiled kernels carry only the shuffle path's cost). The constant is read at import, as
numba.cuda itself is chosen then (the simulator replaces the module; the variable must be
set before numba.cuda is imported), so it cannot disagree with the kernels' numba.cuda;
the other device modules (mma.py, vector.py, async_copy.py, ...) choose their definitions
by it too. Host code that depends on the simulator reads numba.config.ENABLE_CUDASIM when
it runs (GpuBackend, the attention launchers). Block sizes must be multiples of 32.
"""

from __future__ import annotations

from numba import config, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)
WARP = 32
MAX_THREADS = 1024  # shared scratch of this many slots serves any block size
FULL_MASK = 0xFFFFFFFF
SUM, MAX = False, True  # _through_shared's take_max (the simulator's kernels take no keywords)


@cuda.jit(device=True, inline=True)
def warp_sum(v):
    """Sum of v over the 32 lanes of a warp, returned to every lane (butterfly)."""
    off = 16
    while off > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, off)
        off //= 2
    return v


@cuda.jit(device=True, inline=True)
def warp_max(v):
    """Max of v over the 32 lanes of a warp, returned to every lane."""
    off = 16
    while off > 0:
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, off))
        off //= 2
    return v


@cuda.jit(device=True)
def _through_shared(v, buf, s, lo, hi, take_max):
    """The simulator's reduction (it has no shuffles): every thread stores v in buf, then
    folds buf[lo:hi] into s by + (or max); barriers before and after, so buf is free again."""
    buf[cuda.threadIdx.x] = v
    cuda.syncthreads()
    for i in range(lo, hi):
        s = max(s, buf[i]) if take_max else s + buf[i]
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def group_sum(v, buf, zero, width):
    """Sum of v over each aligned group of `width` lanes (a power of 2, at most 32),
    returned to its lanes; buf: shared (MAX_THREADS,) scratch.

    Every warp of the block must call it the same number of times: the simulator's path
    (it has no shuffles) meets through shared memory at block barriers.
    """
    if SIMULATOR:
        lo = cuda.threadIdx.x - cuda.threadIdx.x % width
        return _through_shared(v, buf, zero, lo, lo + width, SUM)
    off = width // 2
    while off > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, off)
        off //= 2
    return v


@cuda.jit(device=True)
def warp_sum_all(v, buf, zero):
    """Sum of v over each warp, returned to its lanes (group_sum over 32 lanes)."""
    return group_sum(v, buf, zero, WARP)


@cuda.jit(device=True)
def warp_max_all(v, buf, lowest):
    """Max of v over each warp, returned to its lanes; `lowest` is the identity (-inf).
    The same calling rule as group_sum."""
    if SIMULATOR:
        lo = cuda.threadIdx.x - cuda.threadIdx.x % WARP
        return _through_shared(v, buf, lowest, lo, lo + WARP, MAX)
    return warp_max(v)


@cuda.jit(device=True)
def block_sum(v, buf, zero):
    """Sum of v over the block, returned to every thread; buf: shared (MAX_THREADS,) scratch.

    `zero` is 0 in the working type. Ends with a barrier, so buf may be reused at once.
    """
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    if SIMULATOR:
        return _through_shared(v, buf, zero, 0, n, SUM)
    v = warp_sum(v)
    if tid % WARP == 0:
        buf[tid // WARP] = v
    cuda.syncthreads()
    lane = tid % WARP
    v = buf[lane] if lane < n // WARP else zero
    v = warp_sum(v)
    cuda.syncthreads()
    return v


@cuda.jit(device=True)
def block_max(v, buf, lowest):
    """Max of v over the block, returned to every thread; `lowest` is the identity (-inf)."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    if SIMULATOR:
        return _through_shared(v, buf, lowest, 0, n, MAX)
    v = warp_max(v)
    if tid % WARP == 0:
        buf[tid // WARP] = v
    cuda.syncthreads()
    lane = tid % WARP
    v = buf[lane] if lane < n // WARP else lowest
    v = warp_max(v)
    cuda.syncthreads()
    return v


@cuda.jit(device=True, inline=True)
def sum_warp_rows(partial, acc, c, W, D, T):
    """After a barrier, partial[c] (D,) = the sum of the W warps' rows of acc, in order."""
    cuda.syncthreads()
    for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        s = T(0.0)
        for qq in range(W):
            s += acc[qq * D + d]
        partial[c, d] = s
