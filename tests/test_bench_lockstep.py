"""bench/cpu_lockstep.py's turns: two engines' steps alternate and never overlap."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.cpu_lockstep import pair_ratios
from euler.bench.timing import StepTurns, time_steps


def _engine(name: str, turns: StepTurns, spans: list, stats: dict, steps: int, warmup: int):
    """A thread that runs time_steps in turns; each step sleeps 5 ms and notes its span."""

    def step() -> float:
        t0 = time.perf_counter()
        time.sleep(0.005)
        spans.append((name, t0, time.perf_counter()))
        return 1.0

    def run() -> None:
        stats[name] = time_steps(step, lambda: None, steps, warmup, turns)

    return threading.Thread(target=run)


def test_steps_in_turns_alternate_and_never_overlap():
    spans: list[tuple[str, float, float]] = []
    pipes, stats, workers, fds = {}, {}, [], []
    steps, warmup = 4, 2
    for name in ("a", "b"):
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        pipes[name] = (go_w, done_r)
        fds += [go_r, go_w, done_r, done_w]
        workers.append(_engine(name, StepTurns(go_r, done_w), spans, stats, steps, warmup))
    for w in workers:
        w.start()
    order = []
    for i in range(1 + warmup + steps):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            go_w, done_r = pipes[name]
            os.write(go_w, b"g")
            assert os.read(done_r, 1) == b"d"
            order.append(name)
    for w in workers:
        w.join(timeout=10)
    assert [s[0] for s in spans] == order  # each step ran when its turn came, in that order
    for (_, _, end), (_, start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start  # no step began before the one before it had ended
    for fd in fds:
        os.close(fd)
    for name in ("a", "b"):
        assert len(stats[name]["step_ms"]) == steps
        assert all(ms >= 5.0 for ms in stats[name]["step_ms"])


def test_a_turn_without_a_driver_stops_with_a_message():
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    os.close(go_w)  # the driver went away
    with pytest.raises(SystemExit, match="driving process went away"):
        StepTurns(go_r, done_w).wait()
    for fd in (go_r, done_r, done_w):
        os.close(fd)


def test_pair_ratios_are_the_peers_ms_over_ours():
    assert pair_ratios([100.0, 50.0], [150.0, 25.0]) == [1.5, 0.5]
