"""The CUDA simulator's block scheduler without its busy poll, and its shared arrays
without a stack trace per call.

numba-cuda's simulator runs a block as one Python thread per GPU thread and releases a
`syncthreads` when every live thread of the block waits in one; it finds that out by a
loop in the launching thread that polls every thread's flags without pause, and that loop
takes the GIL from the threads doing the work. `install()` replaces the poll with a count
kept under a condition: the thread that completes a barrier (by arriving, or by exiting
while all the others wait) releases it. What a kernel sees is unchanged: the same
BlockThread objects (threadIdx, blockIdx, the syncthreads_* reductions), barriers that
count exited threads as arrived, and an exception in one thread aborting the others at
their next barrier and re-raised by the launch.

`cuda.shared.array(shape, dtype)` names an allocation by the file and line of its caller;
the simulator finds them with `traceback.extract_stack`, which reads the source of every
frame of the stack from the line cache, per call and per thread. The replacement reads the
same two fields off the caller's frame, and publishes a new array with one atomic
`dict.setdefault` (the simulator's own get-then-store lets two threads that arrive together
each keep an array of their own).
"""

from __future__ import annotations

import sys
import threading

import numpy as np


def install() -> None:
    """Patch numba.cuda.simulator's BlockManager.run and BlockThread.syncthreads."""
    from numba.cuda.simulator import kernel, kernelapi

    kernel.BlockManager.run = _run_block
    kernel.BlockThread.syncthreads = _syncthreads
    original_array = kernelapi.FakeCUDAShared.array

    def shared_array(self, shape, dtype, alignment=None):
        """A static shared array, one per calling source line (as the simulator's own)."""
        if shape == 0 or alignment is not None:
            return original_array(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        res = self._allocations.get(key)
        if res is None:
            if isinstance(dtype, kernelapi.types.Type):
                dtype = kernelapi.numpy_support.as_dtype(dtype)
            # setdefault, not a store: the block's threads arrive here together, and one
            # that lost the race must take the first thread's array, not keep its own
            res = self._allocations.setdefault(key, np.empty(shape, dtype))
        return res

    kernelapi.FakeCUDAShared.array = shared_array


def _run_block(self, grid_point, *args) -> None:
    """Run one block: start its threads, join them, re-raise the first failure."""
    from numba.cuda.simulator.kernel import BlockThread

    self._cond = threading.Condition()
    points = list(np.ndindex(*self._block_dim))
    self._live, self._waiting, self._generation = len(points), 0, 0
    self._failed: list[BlockThread] = []

    def target() -> None:
        try:
            self._f(*args)
        except BaseException:
            with self._cond:
                if not self._failed:  # abort the others at their barrier, as the original
                    self._failed.append(threading.current_thread())
                    for t in threads:
                        t.abort = True
                    self._cond.notify_all()
            raise
        finally:
            with self._cond:
                self._live -= 1
                if self._waiting and self._waiting == self._live:
                    _release(self)

    threads = [BlockThread(target, self, grid_point, p, self._debug) for p in points]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = self._failed[0] if self._failed else next((t for t in threads if t.exception), None)
    if first is not None and first.exception:
        raise first.exception[0].with_traceback(first.exception[1])


def _release(manager) -> None:
    """Open the barrier every live thread waits at (called holding the condition)."""
    manager._waiting = 0
    manager._generation += 1
    manager._cond.notify_all()


def _syncthreads(self) -> None:
    """Wait until every live thread of the block has arrived (exited threads count)."""
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    m = self._manager
    with m._cond:
        m._waiting += 1
        if m._waiting == m._live:
            _release(m)
        else:
            generation = m._generation
            while m._generation == generation and not self.abort:
                m._cond.wait()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")
