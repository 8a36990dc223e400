"""Core scaling on the CPU: our training step and PyTorch's at 1, 2, 4, ... cores, one run.

    python bench/cpu_scaling.py --threads 1,2,4,8,16 --preset small --json OUT.json --plot OUT.png

For each N a child process is pinned to the first N cores this process may use
(sched_setaffinity) with NUMBA_NUM_THREADS=N and OMP_NUM_THREADS=N; it times our step
(euler.bench.steps.time_engine: forward, backward, clip, AdamW on one fixed batch) and then
PyTorch eager's (torch.set_num_threads(N), in its own process on the same cores), and
torch.compile's at the counts given to --compile-at. Each row: tokens/s, ms a step, cores
busy (process CPU seconds per wall second), ours against each peer. A shared machine's
speed swings by a third within minutes, so `--rounds R` repeats each count R times, with
PyTorch first in every second round, and reports each engine's median round and the ratio
in every round. `--plot-only JSON` redraws the plot of an earlier run (matplotlib: pip
install -e '.[plot]').
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer


def _child(job: dict) -> dict:
    """Runs in the pinned child: ours, then the peers (or the peers first, where the job says
    peer_first), on this process's cores."""
    import numba

    from euler.bench.peer import time_peer_in_own_process
    from euler.bench.steps import synthetic_batch, time_engine
    from euler.cpu.backend import CpuBackend
    from euler.cpu.blas import core_name, default_plan
    from euler.model.config import get_preset

    cfg = get_preset(job["preset"])
    B, T, steps, warmup = job["batch"], job["seq"], job["steps"], job["warmup"]
    tokens, targets = synthetic_batch(cfg, B, T)
    threads = numba.get_num_threads()
    row: dict = {"threads": threads, "cores": sorted(os.sched_getaffinity(0)),
                 "openblas_kernels": core_name()}  # fmt: skip

    def ours() -> None:
        for per_thread in job["per_thread"]:  # the default plan first, then each A/B variant
            plan = None
            if per_thread:  # that many blocks a thread at every thread count
                plan = dataclasses.replace(default_plan(), per_thread=per_thread,
                                           many_threads=1 << 20)  # fmt: skip
            stats = time_engine(cfg, CpuBackend(plan=plan), "cpu", tokens, targets, steps, warmup)
            row[f"ours_per_thread_{per_thread}" if per_thread else "ours"] = stats

    def peers() -> None:
        extra = [("torch_compiled", True)] if job["compile"] else []
        for name, compiled in [("torch_eager", False), *extra] if job["peer"] else []:
            row[name] = time_peer_in_own_process(
                cfg, "cpu", tokens, targets, steps, warmup, threads, "fp32", compiled
            )

    for run in (peers, ours) if job.get("peer_first") else (ours, peers):
        run()
    for stats in (v for v in row.values() if isinstance(v, dict) and "ms_per_step" in v):
        stats["tokens_per_s"] = B * T / (stats["ms_per_step"] / 1e3)
    return row


def pinned_child(n: int, cores: list[int], entry: str, job: dict, fds=()) -> subprocess.Popen:
    """A Python process on the first n of cores with n Numba and OpenMP threads, printing
    entry(job) as its last line of JSON; entry is "module:function" from the repository
    root, fds the file descriptors it inherits."""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
    module, function = entry.split(":")
    code = (  # euler first: it picks OpenBLAS's kernels before NumPy loads the library
        f"import euler; import json, sys; from {module} import {function}; "
        f"print(json.dumps({function}(json.loads(sys.argv[1]))))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(job)], env=env, pass_fds=fds,
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, cores[:n]),
    )  # fmt: skip


def _run_pinned(n: int, cores: list[int], job: dict) -> dict:
    proc = pinned_child(n, cores, "bench.cpu_scaling:_child", job)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"threads={n}: the child failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _median_row(rounds: list[dict]) -> dict:
    """One row from a thread count's rounds: each engine's round of median tokens/s (its
    ms, cores busy and loss with it), the rounds' tokens/s, and ours / each peer per round."""
    row = dict(rounds[0])
    for key, first in rounds[0].items():
        if not (isinstance(first, dict) and "tokens_per_s" in first):
            continue
        by_speed = sorted((r[key] for r in rounds), key=lambda s: s["tokens_per_s"])
        row[key] = dict(by_speed[(len(by_speed) - 1) // 2], rounds_tokens_per_s=[
            round(r[key]["tokens_per_s"]) for r in rounds])  # fmt: skip
        if key != "ours" and "ours" in row:
            row[key]["rounds_ours_over_this"] = [
                round(r["ours"]["tokens_per_s"] / r[key]["tokens_per_s"], 3) for r in rounds
            ]
    return row


def _cores_busy(stats: dict) -> float | None:
    return stats.get("cpu_s_per_wall_s", stats.get("cpu_seconds_per_wall_second"))


def table(rows: list[dict]) -> str:
    """A Markdown table: per thread count, tokens/s and cores busy of each engine, ratios."""
    lines = [
        "| cores | ours tokens/s | cores busy | torch eager | ours / eager | torch.compile "
        "| ours / compile |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = r["ours"]["tokens_per_s"]
        cells = [str(r["threads"]), f"{ours:,.0f}", f"{_cores_busy(r['ours']):.2f}"]
        for peer in ("torch_eager", "torch_compiled"):
            p = r.get(peer, {}).get("tokens_per_s")
            cells += [f"{p:,.0f}", f"{ours / p:.2f}x"] if p else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """tokens/s against cores for each engine, from a report of this script."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("ours", "NanoEuler"), ("torch_eager", "PyTorch eager"),
                       ("torch_compiled", "torch.compile")):  # fmt: skip
        pts = [
            (r["threads"], r[key]["tokens_per_s"]) for r in rows if "tokens_per_s" in r.get(key, {})
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cores (threads)")
    ax.set_ylabel("training tokens/s")
    ax.set_title(f"{report['preset']}, B={report['batch']} x T={report['seq']}, {report['cpu']}",
                 fontsize=8)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# the workload's options, shared with bench/cpu_lockstep.py
Preset = Annotated[str, typer.Option(help="Model preset.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Sequences per step (B).")]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence (T).")]
UntimedSteps = Annotated[
    int, typer.Option("--untimed-steps", help="Untimed steps after the first.")
]


def main(
    threads: Annotated[str, typer.Option(help="Thread counts, comma-separated.")] = "1,2",
    preset: Preset = "small",
    batch: BatchSize = 16,
    seq: SeqLen = 128,
    steps: Annotated[int, typer.Option(help="Timed steps per engine.")] = 10,
    warmup: UntimedSteps = 2,
    peer: Annotated[bool, typer.Option(help="Time PyTorch eager too.")] = True,
    compile_at: Annotated[
        str, typer.Option(help="Thread counts at which torch.compile is timed too.")
    ] = "",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="Write the plot here.")] = None,
    plot_only: Annotated[Path | None, typer.Option(help="Only redraw this report's plot.")] = None,
    ab_per_thread: Annotated[
        str, typer.Option(help="Also time ours with N blocks a thread at any count, each N given.")
    ] = "",
    rounds: Annotated[
        int,
        typer.Option(
            help="Rounds a thread count, each a fresh process, PyTorch first in every "
            "second one; each engine's median round is reported."
        ),  # fmt: skip
    ] = 1,
) -> None:
    """Time ours and PyTorch at each thread count, pinned to that many cores."""
    if plot_only is not None:
        plot(json.loads(plot_only.read_text()), plot_out or plot_only.with_suffix(".png"))
        return
    cores = sorted(os.sched_getaffinity(0))
    counts = [int(t) for t in threads.split(",")]
    if max(counts) > len(cores):
        raise SystemExit(f"--threads: {max(counts)} is more than the {len(cores)} cores here")
    compiled = {int(t) for t in compile_at.split(",") if t}
    rows = []
    for n in counts:
        job = {"preset": preset, "batch": batch, "seq": seq, "steps": steps, "warmup": warmup,
               "peer": peer, "compile": n in compiled,
               "per_thread": [0, *(int(b) for b in ab_per_thread.split(",") if b)]}  # fmt: skip
        rows.append(_median_row([_run_pinned(n, cores, dict(job, peer_first=r % 2 == 1))
                                 for r in range(rounds)]))  # fmt: skip
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        for key in (k for k in rows[-1] if k.startswith("ours_per_thread_")):
            print(f"  {key}: {rows[-1][key]['tokens_per_s']:,.0f} tokens/s", flush=True)
    report = {
        "report": "cpu scaling",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": cpu_name(),
        "cores_here": len(cores),
        "preset": preset,
        "batch": batch,
        "seq": seq,
        "rounds": rounds,
        "openblas_kernels": rows[0]["openblas_kernels"],
        "rows": rows,
    }
    print(table(rows))
    print(f"ours on OpenBLAS's {report['openblas_kernels']} kernels")
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=1) + "\n")
    if plot_out is not None:
        plot(report, plot_out)


if __name__ == "__main__":
    typer.run(main)
