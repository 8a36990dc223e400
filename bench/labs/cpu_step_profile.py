"""Where a CPU training step's time goes: each backend method's share, at this thread count.

    NUMBA_NUM_THREADS=16 taskset -c 0-15 python bench/labs/cpu_step_profile.py --preset small
    OMP_NUM_THREADS=16 taskset -c 0-15 python bench/labs/cpu_step_profile.py --engine torch

Wraps every method of a CpuBackend in a timer, runs warm training steps and prints the
milliseconds a step each method took (summed over its calls), with the time outside any
method (Python's share of the schedule) as "(between calls)". `--engine torch` profiles
PyTorch eager's step (euler.bench.torch_peer.training_step) with torch.profiler instead:
each aten op's self CPU milliseconds a step, the ops above 0.5% of the total.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Annotated

import numba
import typer

from euler.bench.steps import synthetic_batch
from euler.cpu.backend import CpuBackend
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.optim import AdamW


class Timed:
    """A backend whose public methods add their wall time to `spent` (seconds, by name)."""

    def __init__(self, be):
        self._be = be
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __getattr__(self, name):
        value = getattr(self._be, name)
        if name.startswith("_") or not callable(value):
            return value

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.spent[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed


def main(
    preset: Annotated[str, typer.Option()] = "small",
    batch: Annotated[int, typer.Option("--batch-size")] = 16,
    seq: Annotated[int, typer.Option("--seq-len")] = 128,
    steps: Annotated[int, typer.Option()] = 10,
    engine: Annotated[str, typer.Option(help="ours or torch (PyTorch eager)")] = "ours",
) -> None:
    """Print each backend method's (or torch op's) milliseconds a step, one JSON line."""
    cfg = get_preset(preset)
    if engine == "torch":
        print(json.dumps({"preset": preset, **torch_profile(cfg, batch, seq, steps)}))
        return
    if engine != "ours":
        raise typer.BadParameter(f"--engine: expected ours or torch, got {engine!r}")
    tokens, targets = synthetic_batch(cfg, batch, seq)
    be = Timed(CpuBackend())
    model = Model(cfg, backend=be, seed=0)
    opt = AdamW(model)

    def step():
        model.forward(tokens, targets, need_grad=True)
        model.backward()
        opt.step(1e-3)

    for _ in range(3):
        step()
    be.spent.clear()
    be.calls.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - t0) / steps
    rows = {k: 1e3 * v / steps for k, v in sorted(be.spent.items(), key=lambda kv: -kv[1])}
    rows["(between calls)"] = 1e3 * wall - sum(rows.values())
    print(json.dumps({"engine": "ours", "preset": preset, "batch": batch, "seq": seq,
                      "threads": numba.get_num_threads(), "layer": numba.threading_layer(),
                      "wait_policy": os.environ.get("OMP_WAIT_POLICY"), "ms_per_step": 1e3 * wall,
                      "tokens_per_s": batch * seq / wall,
                      "ms": {k: round(v, 3) for k, v in rows.items()},
                      "calls": {k: v // steps for k, v in be.calls.items()}}))  # fmt: skip


def torch_profile(cfg, batch: int, seq: int, steps: int) -> dict:
    """PyTorch eager's step on torch.get_num_threads() threads (from OMP_NUM_THREADS):
    its wall ms a step and each op's self CPU ms a step (ops above 0.5% of all)."""
    import torch

    from euler.bench.torch_peer import training_step

    step = training_step(cfg, batch, seq)
    for _ in range(3):
        step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t0) / steps
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    total = sum(ops.values())
    top = {k: round(v, 3) for k, v in sorted(ops.items(), key=lambda kv: -kv[1]) if v > total / 200}
    return {"engine": "torch", "batch": batch, "seq": seq,
            "threads": torch.get_num_threads(), "ms_per_step": 1e3 * wall,
            "self_cpu_ms_per_step": total, "ms": top}  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
