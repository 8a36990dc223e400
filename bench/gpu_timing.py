"""Device time of GPU calls, without the host's launch cost: the timing of the GPU labs.

A CUDA event recorded before a launch fires as soon as the device reaches it, so events
around one call time the host's launch too: a numba.cuda launch costs 40-90 us of Python
(arguments, checks, the dispatcher), as much as a small kernel. On the H200 the tensor-core
attention forward at T=64 (one wave of one-tile blocks) timed 0.096 ms that way
(results/attention-tc-lengths-2026-11-29T2231-h200.json), and at T=512 0.30 ms against
0.23 ms inside a captured step (bench_gpu.py's device-only profile).

`timed` holds the stream with a spinning kernel (`hold_stream`), records the start event
and `calls` calls behind it while the spin runs, so that the events bracket the kernels
alone, back to back.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from numba import cuda

from euler.bench.kernels import GPU_CALLS

WARM_S = 0.5  # seconds of calls before timing: after NVVM's compile the GPU has idled
CALLS = GPU_CALLS  # calls timed back to back in a round, as `euler bench` times a GPU layer
HOLD_MS = 20.0  # the spin ahead of a round: far longer than the host takes to queue it


@cuda.jit
def _busy(out, n):
    """One thread, n dependent integer multiply-adds (a few ns each): holds the stream."""
    x = out[0]
    for _ in range(n):
        x = x * np.uint32(1103515245) + np.uint32(12345)
    out[0] = x


_PER_ITER: dict[int, tuple] = {}  # id(stream) -> (scratch, ms per _busy iteration)


def _events_ms(stream, fn, n: int = 1) -> float:
    """ms between events around n calls of fn on stream (host launch time included)."""
    start, stop = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(n):
        fn()
    stop.record(stream)
    stop.synchronize()
    return start.elapsed_time(stop)


def hold_stream(stream, ms: float) -> float:
    """Start a kernel that keeps stream busy for about ms milliseconds (calibrated once per
    stream); returns its calibrated length in ms."""
    key = id(stream)
    if key not in _PER_ITER:
        scratch = cuda.device_array(1, np.uint32, stream=stream)
        n = 1 << 20
        ms_n = min(_events_ms(stream, lambda: _busy[1, 1, stream](scratch, n)) for _ in range(3))
        _PER_ITER[key] = scratch, ms_n / n
    scratch, per_iter = _PER_ITER[key]
    iters = int(ms / per_iter)
    _busy[1, 1, stream](scratch, iters)
    return iters * per_iter


def timed(stream, fn, reps: int, calls: int = CALLS) -> float:
    """Median device ms of one fn() over reps rounds, each `calls` calls queued behind a
    HOLD_MS spin and timed together, after WARM_S seconds of calls."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_S:
        fn()
        stream.synchronize()
    times = []
    for _ in range(reps):
        hold_stream(stream, HOLD_MS)
        times.append(_events_ms(stream, fn, calls) / calls)
    return float(np.median(times))


def lengths_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the launch-free benchmarks over sequence lengths: --T (comma-separated
    lengths), --batch, --reps (rounds of `timed`), --out (a JSON file of the rows)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--T", default="512,2048")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    return ap
