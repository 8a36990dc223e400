"""Ours and PyTorch eager on the same cores, one step each in turn: a paired comparison.

    python bench/cpu_lockstep.py --threads 2 --steps 60 --untimed-steps 10 --json OUT.json

bench/cpu_scaling.py times each engine in rounds of consecutive steps. On a shared machine
whose speed swings within seconds (the lent Xeon: one engine's rounds 13,681 to 23,278
tokens/s in one run), a round's ratio says as much about the machine as about the engines.
Here two processes pinned to the same first N cores (NUMBA_NUM_THREADS=N, OMP_NUM_THREADS=N;
PyTorch with torch.set_num_threads(N) in a fresh process, as cpu_scaling runs it) take their
steps in alternation, never together: this driver hands each its turn through a pipe
(euler.bench.timing.StepTurns), ours first in every second pair. The two steps of a pair
meet nearly the same machine, so the median of the pairs' ratios (PyTorch's ms over ours)
measures the engines. A waiting process blocks in a read; its thread pools spin briefly
after their last parallel loop, then sleep.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.cpu_scaling import (  # noqa: E402
    BatchSize,
    Preset,
    SeqLen,
    UntimedSteps,
    cpu_name,
    pinned_child,
)

ENGINES = ("ours", "torch_eager")
WAIT_S = 900  # the longest a step may take, its first (compiling) one included


def _worker(job: dict) -> dict:
    """Runs in a pinned child: one engine's steps, each in its turn; its statistics."""
    import numba

    from euler.bench.peer import time_peer_in_own_process
    from euler.bench.steps import synthetic_batch, time_engine
    from euler.bench.timing import StepTurns
    from euler.cpu.backend import CpuBackend
    from euler.model.config import get_preset

    cfg = get_preset(job["preset"])
    tokens, targets = synthetic_batch(cfg, job["batch"], job["seq"])
    turns = StepTurns(*job["turns"])
    steps, warmup = job["steps"], job["warmup"]
    if job["engine"] == "ours":
        return time_engine(cfg, CpuBackend(), "cpu", tokens, targets, steps, warmup, turns=turns)
    threads = numba.get_num_threads()
    return time_peer_in_own_process(
        cfg, "cpu", tokens, targets, steps, warmup, threads, "fp32", False, turns
    )


def _why(proc: subprocess.Popen) -> str:
    """A dead worker's last word: its skip reason or the last line of its errors."""
    out, err = proc.communicate(timeout=60)
    last = out.strip().splitlines()[-1:] if out.strip() else []
    if last and "skipped" in last[0]:
        return json.loads(last[0])["skipped"]
    return (err.strip().splitlines() or ["no output"])[-1]


def _turn(go: int, done: int) -> bool:
    """Give a worker one step; whether it came back within WAIT_S (False: it is gone)."""
    try:
        os.write(go, b"g")
    except BrokenPipeError:
        return False
    ready, _, _ = select.select([done], [], [], WAIT_S)
    return bool(ready) and os.read(done, 1) == b"d"


def pair_ratios(ours_ms: list[float], peer_ms: list[float]) -> list[float]:
    """Each pair's peer ms over ours: above 1 where ours was the faster of the pair."""
    return [p / o for o, p in zip(ours_ms, peer_ms, strict=True)]


def main(
    threads: Annotated[int, typer.Option(help="Cores (the first this process may use).")] = 2,
    preset: Preset = "small",
    batch: BatchSize = 16,
    seq: SeqLen = 128,
    steps: Annotated[int, typer.Option(help="Timed steps per engine (pairs).")] = 60,
    warmup: UntimedSteps = 10,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Time ours and PyTorch eager in alternating steps on the same cores; print the ratio."""
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(cores):
        raise SystemExit(f"--threads: {threads} is not between 1 and the {len(cores)} cores here")
    if steps < 1 or warmup < 0:
        raise SystemExit("--steps must be at least 1 and --untimed-steps at least 0")
    procs, go, done = {}, {}, {}
    for name in ENGINES:
        go_r, go[name] = os.pipe()
        done[name], done_w = os.pipe()
        job = {"engine": "ours" if name == "ours" else "torch", "preset": preset,
               "batch": batch, "seq": seq, "steps": steps, "warmup": warmup,
               "turns": [go_r, done_w]}  # fmt: skip
        procs[name] = pinned_child(threads, cores, "bench.cpu_lockstep:_worker", job,
                                   (go_r, done_w))  # fmt: skip
        os.close(go_r)
        os.close(done_w)
    for i in range(1 + warmup + steps):
        for name in ENGINES if i % 2 == 0 else ENGINES[::-1]:
            if not _turn(go[name], done[name]):
                for p in procs.values():
                    p.kill()
                raise SystemExit(f"{name}: no step came back: {_why(procs[name])}")
    stats = {}
    for name, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{name}: the worker failed: {(err.strip().splitlines() or [''])[-1]}")
        stats[name] = json.loads(out.strip().splitlines()[-1])
        stats[name]["tokens_per_s"] = batch * seq / (stats[name]["ms_per_step"] / 1e3)
    ratios = pair_ratios(stats["ours"]["step_ms"], stats["torch_eager"]["step_ms"])
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    report = {
        "report": "cpu lockstep: ours and PyTorch eager, one step each in turn",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": cpu_name(),
        "cores": cores[:threads],
        "preset": preset,
        "batch": batch,
        "seq": seq,
        "engines": stats,
        "pair_ratios": [round(r, 4) for r in ratios],
        "ratio_median": median,
        "ratio_quartiles": [q1, q3],
    }
    print(f"{threads} cores, {steps} pairs: ours {stats['ours']['tokens_per_s']:,.0f} tokens/s, "
          f"PyTorch eager {stats['torch_eager']['tokens_per_s']:,.0f}; ours / eager, the "
          f"median pair {median:.2f}x (quartiles {q1:.2f} to {q3:.2f})")  # fmt: skip
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    typer.run(main)
