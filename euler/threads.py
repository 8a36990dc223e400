"""The threads a command computes on (`--threads`): by default, the cores it may use.

Numba's pool is sized once, when a process first runs a parallel loop (NUMBA_NUM_THREADS,
else the machine's core count); a command then runs its loops on up to that many threads.
The default is the cores this process may run on (its affinity mask, as `taskset` or a
container sets it), not the machine's count: a process pinned to 4 of 16 cores that ran 16
threads would time-share each core among four of them.
"""

from __future__ import annotations

import os

import numba

from euler.errors import EulerError


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def pick_threads(n: int | None, flag: str = "--threads") -> int:
    """n checked against Numba's pool (one line naming `flag` if out of range), or by
    default the usable cores (at most the pool)."""
    pool = numba.config.NUMBA_NUM_THREADS
    if n is None:
        return max(1, min(usable_cores(), pool))
    if isinstance(n, bool) or not 1 <= n <= pool:
        raise EulerError(
            f"{flag} must be in [1, {pool}] (Numba's pool here: NUMBA_NUM_THREADS, else the "
            f"machine's cores), got {n}"
        )
    return n


def use_threads(n: int | None, flag: str = "--threads") -> int:
    """Run this thread's Numba parallel loops on pick_threads(n) threads; returns the count."""
    n = pick_threads(n, flag)
    numba.set_num_threads(n)
    return n
