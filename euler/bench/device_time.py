"""Device time of GPU calls without the host's launch cost: `euler bench`'s layer and
attention times on cuda, and bench/gpu_timing.py's (the GPU labs').

A CUDA event recorded before a launch fires as soon as the device reaches it, so events
around one call time the host's launch too: a numba.cuda launch costs 40-90 us of Python
(arguments, checks, the dispatcher), as much as a small kernel. Ten calls queued back to
back do not hide it either: the device runs each kernel as soon as it is launched, so a
round of small kernels is as long as its launches (RoPE at the `gpu` preset in bf16: 0.146
ms a call so, 0.016 ms launch-free). `hold_stream` starts a spinning kernel first, and the
events and calls are queued behind it while it spins, so that they bracket the kernels
alone, back to back. Imported only on a GPU (numba.cuda).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

HOLD_MS = 20.0  # the spin ahead of a round: far longer than the host takes to queue it


@cuda.jit
def _busy(out, n):
    """One thread, n dependent integer multiply-adds (a few ns each): holds the stream."""
    x = out[0]
    for _ in range(n):
        x = x * np.uint32(1103515245) + np.uint32(12345)
    out[0] = x


_PER_ITER: dict[int, tuple] = {}  # id(stream) -> (scratch, ms per _busy iteration)


def events_ms(stream, fn, n: int = 1) -> float:
    """ms between events around n calls of fn on stream (host launch time included)."""
    start, stop = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(n):
        fn()
    stop.record(stream)
    stop.synchronize()
    return start.elapsed_time(stop)


def hold_stream(stream, ms: float, calibrate: int = 1 << 20) -> float:
    """Start a kernel that keeps stream busy for about ms milliseconds (calibrated once per
    stream, by `calibrate` iterations); returns its calibrated length in ms."""
    key = id(stream)
    if key not in _PER_ITER:
        scratch = cuda.device_array(1, np.uint32, stream=stream)
        k = calibrate
        ms_k = min(events_ms(stream, lambda: _busy[1, 1, stream](scratch, k)) for _ in range(3))
        _PER_ITER[key] = scratch, max(ms_k, 1e-6) / k
    scratch, per_iter = _PER_ITER[key]
    iters = int(ms / per_iter)
    _busy[1, 1, stream](scratch, iters)
    return iters * per_iter


def best_device_ms(stream, fn, reps: int, calls: int, hold_ms: float = HOLD_MS) -> float:
    """Fastest of `reps` rounds of `calls` calls of fn queued behind a hold_ms spin on stream,
    in device ms per call, after one untimed call (which compiles or warms caches)."""
    fn()
    stream.synchronize()
    best = math.inf
    for _ in range(reps):
        hold_stream(stream, hold_ms)
        best = min(best, events_ms(stream, fn, calls) / calls)
    return best
