"""Timing and memory helpers shared by `euler bench`'s measurements.

Times are wall-clock around synchronised calls (`sync` waits for a device; on the CPU it
does nothing). Memory is this process's resident set, read from /proc on Linux.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def best_ms(fn: Callable[[], object], sync: Callable[[], None], reps: int, calls: int = 1) -> float:
    """Fastest of `reps` rounds of `calls` calls of fn and one sync, in ms per call, after one
    untimed call. On a GPU, calls > 1 queues the launches ahead of the device, so that a
    round times the kernels more than the host's launch of each (40-90 us from Python)."""
    fn()
    sync()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return 1e3 * best


@dataclass(frozen=True)
class StepTurns:
    """Pipe ends through which a driving process hands this one each step's turn, so that
    two engines on the same cores take steps in alternation and never overlap
    (bench/cpu_lockstep.py): a byte read from `go` starts a step, a byte written to `done`
    ends it."""

    go: int
    done: int

    def wait(self) -> None:
        """Block until the driver gives this process the next step."""
        if os.read(self.go, 1) != b"g":
            raise SystemExit("lockstep: the driving process went away")

    def finished(self) -> None:
        """Tell the driver that the step is over (the device synchronised)."""
        os.write(self.done, b"d")


def _nothing() -> None:
    pass


def time_steps(
    step: Callable[[], float],
    sync: Callable[[], None],
    steps: int,
    warmup: int,
    turns: StepTurns | None = None,
) -> dict:
    """Run 1 + warmup untimed training steps, then `steps` timed ones; their statistics.

    The first step is timed apart (`first_step_s`): it compiles. tokens/s is left to the
    caller, which knows the tokens per step; `loss_last` is the last step's loss. With
    turns, every step waits for its turn, and `step_ms` lists the timed steps' ms in order.
    """
    wait, finished = (turns.wait, turns.finished) if turns is not None else (_nothing, _nothing)

    def one() -> tuple[float, float, float]:
        """A step in its turn: (loss, s until step() returned, s until synchronised)."""
        wait()
        t0 = time.perf_counter()
        loss = step()
        returned = time.perf_counter() - t0
        sync()
        done = time.perf_counter() - t0
        finished()
        return loss, returned, done

    first_s = one()[2]
    for _ in range(warmup):
        one()
    cpu0 = time.process_time()
    runs = [one() for _ in range(steps)]
    loss = runs[-1][0] if runs else math.nan
    host, times = [r[1] for r in runs], [r[2] for r in runs]
    extra = {"step_ms": [round(1e3 * t, 3) for t in times]} if turns is not None else {}
    return extra | {
        "steps_timed": steps,
        "ms_per_step": 1e3 * float(np.median(times)),
        # until step() returned: Python's share on a GPU, which then waits for the device
        "host_ms_per_step": 1e3 * float(np.median(host)),
        "ms_per_step_min": 1e3 * min(times),
        "ms_per_step_mean": 1e3 * float(np.mean(times)),
        "first_step_s": first_s,
        "loss_last": float(loss),
        # near the thread count when the cores were ours; lower when others took them
        "cpu_s_per_wall_s": (time.process_time() - cpu0) / sum(times),
    }


def _status_mib(key: str) -> float | None:
    """A memory field of /proc/self/status ("VmRSS", "VmHWM") in MiB; None without /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> float | None:
    """Restart this process's peak-RSS counter (VmHWM); return the RSS now, in MiB.

    The RSS now is the baseline a phase's peak includes: libraries, earlier arrays.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: peak_rss_mib falls back to the lifetime peak
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB since reset_peak_rss (where supported)."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
