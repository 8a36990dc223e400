"""Device time of GPU calls, without the host's launch cost: the timing of the GPU labs.

A CUDA event recorded before a launch fires as soon as the device reaches it, so events
around one call time the host's launch too: a numba.cuda launch costs 40-90 us of Python
(arguments, checks, the dispatcher), as much as a small kernel. On the H200 the tensor-core
attention forward at T=64 (one wave of one-tile blocks) timed 0.096 ms that way, and at
T=512 0.30 ms against
0.23 ms inside a captured step (bench_gpu.py's device-only profile).

`timed` holds the stream with a spinning kernel (`hold_stream`, from
euler/bench/device_time.py, which `euler bench` times its GPU layers with), records the
start event and `calls` calls behind it while the spin runs, so that the events bracket
the kernels alone, back to back.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from euler.bench.device_time import HOLD_MS, hold_stream
from euler.bench.device_time import events_ms as _events_ms
from euler.bench.kernels import GPU_CALLS

__all__ = ["CALLS", "HOLD_MS", "WARM_S", "hold_stream", "lengths_parser", "timed"]

WARM_S = 0.5  # seconds of calls before timing: after NVVM's compile the GPU has idled
CALLS = GPU_CALLS  # calls timed back to back in a round, as `euler bench` times a GPU layer


def timed(stream, fn, reps: int, calls: int = CALLS, warm_s: float = WARM_S) -> float:
    """Median device ms of one fn() over reps rounds, each `calls` calls queued behind a
    HOLD_MS spin and timed together, after warm_s seconds of calls."""
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        fn()
        stream.synchronize()
    times = []
    for _ in range(reps):
        hold_stream(stream, HOLD_MS)
        times.append(_events_ms(stream, fn, calls) / calls)
    return float(np.median(times))


def lengths_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the launch-free benchmarks over sequence lengths: --T (comma-separated
    lengths), --batch-size, --reps (rounds of `timed`), --out (a JSON file of the rows)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--T", default="512,2048")
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    return ap
