"""Every step's time, in order, for several engines made one after the other in one process.

    NUMBA_NUM_THREADS=2 taskset -c 0-1 python bench/labs/cpu_step_times.py --engines 3

Asks whether a CPU step gets faster with time (the first engine of a process has timed
slower than the later ones on the lent Xeon) and what changes with it: each step's wall ms,
the minor page faults and system CPU ms it took, and the process's transparent huge pages
(AnonHugePages of /proc/self/smaps_rollup) after each engine. One JSON line per engine.
"""

from __future__ import annotations

import json
import resource
import time
from typing import Annotated

import numba
import typer

from euler.bench.steps import synthetic_batch
from euler.cpu.backend import CpuBackend
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.optim import AdamW


def huge_pages_kib() -> int:
    """This process's anonymous memory on transparent huge pages, KiB (-1 if unknown)."""
    try:
        text = open("/proc/self/smaps_rollup").read()
    except OSError:
        return -1
    return int(text.split("AnonHugePages:")[1].split()[0])


def main(
    preset: Annotated[str, typer.Option()] = "small",
    batch: Annotated[int, typer.Option("--batch-size")] = 16,
    seq: Annotated[int, typer.Option("--seq-len")] = 128,
    steps: Annotated[int, typer.Option()] = 40,
    engines: Annotated[int, typer.Option()] = 3,
) -> None:
    """Print one JSON line per engine: each step's ms, page faults and system ms."""
    cfg = get_preset(preset)
    tokens, targets = synthetic_batch(cfg, batch, seq)
    start = time.perf_counter()
    for e in range(engines):
        model = Model(cfg, backend=CpuBackend(), seed=0)
        opt = AdamW(model)
        ms, faults, sys_ms = [], [], []
        for _ in range(steps):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            model.forward(tokens, targets, need_grad=True)
            model.backward()
            opt.step(1e-3)
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            ms.append(round(1e3 * (t1 - t0), 2))
            faults.append(r1.ru_minflt - r0.ru_minflt)
            sys_ms.append(round(1e3 * (r1.ru_stime - r0.ru_stime), 1))
        tail = sorted(ms[steps // 2 :])
        print(json.dumps({"engine": e, "threads": numba.get_num_threads(),
                          "at_s": round(time.perf_counter() - start, 1),
                          "median_second_half_ms": tail[len(tail) // 2], "ms": ms,
                          "minor_faults": faults, "sys_ms": sys_ms,
                          "anon_huge_kib": huge_pages_kib()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
