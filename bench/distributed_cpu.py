"""Data-parallel speed on the CPU: 2 MPI ranks of 1 Numba thread against 1 process of 2.

    python bench/distributed_cpu.py --preset small --batch-size 16 --steps 20 --pairs 3 --json FILE

Runs `euler train` (the embedded corpus, no checkpoints, one evaluation batch) alternately
as one process (Numba and OpenBLAS 2 threads each) and as `--nproc 2` (1 of each per rank),
`--pairs` times, and takes each run's median tokens/s over its steps after the first
`--untimed-steps` (from metrics.jsonl, which times the step only). The machine is shared:
the load average before each run and the CPU seconds per wall second of each run are kept
beside its speed.
`allreduce` (run under mpiexec by this script) times MPI_Allreduce of a flat float32
buffer the size of the model's gradient: the cost bucketing could hide, if anything
overlapped it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def run_train(preset: str, batch: int, steps: int, nproc: int, threads: int, warmup: int):
    """One `euler train` run; (median step tokens/s, CPU s per wall s, load avg before)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "euler.cli", "train", "--preset", preset, "--out", tmp,
               "--overwrite", "--batch-size", str(batch), "--steps", str(steps),
               "--eval-every", str(10 * steps), "--ckpt-every", str(10 * steps),
               "--eval-batches", "1", "--sample-tokens", "0", "--nproc", str(nproc)]  # fmt: skip
        pools = ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
        env = dict(os.environ, **{pool: str(threads) for pool in pools})
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [json.loads(line) for line in Path(tmp, "metrics.jsonl").read_text().splitlines()]
    tok_s = [r["tok_s"] for r in rows if "tok_s" in r][warmup:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return statistics.median(tok_s), cpu / wall, load


def allreduce(n: int, repeats: int) -> None:
    """Under mpiexec: print rank 0's median seconds of an in-place Allreduce of n floats."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    buf = np.ones(n, dtype=np.float32)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        times.append(time.perf_counter() - t0)
    if comm.rank == 0:
        print(statistics.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--untimed-steps",
        dest="warmup",
        metavar="N",
        type=int,
        default=3,
        help="steps left out of the median (the first included)",
    )
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--allreduce", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.allreduce:
        allreduce(args.allreduce, repeats=50)
        return

    from euler.model.config import get_preset
    from euler.training.distributed import mpiexec_path

    cfg = get_preset(args.preset)
    runs = {"1 process x 2 threads": [], "2 ranks x 1 thread": []}
    for _ in range(args.pairs):
        for name, nproc, threads in (("1 process x 2 threads", 1, 2), ("2 ranks x 1 thread", 2, 1)):
            tps, cpu, load = run_train(args.preset, args.batch, args.steps, nproc, threads,
                                       args.warmup)  # fmt: skip
            runs[name].append({"tokens_per_s": tps, "cpu_s_per_wall_s": cpu, "load_before": load})
            print(f"{name}: {tps:,.0f} tok/s (cpu {cpu:.2f} s/s, load {load:.2f})", flush=True)
    n = cfg.n_params()
    out = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, __file__, "--allreduce",
                          str(n)], check=True, capture_output=True, text=True)  # fmt: skip
    ar = float(out.stdout.strip())
    one = statistics.median(r["tokens_per_s"] for r in runs["1 process x 2 threads"])
    two = statistics.median(r["tokens_per_s"] for r in runs["2 ranks x 1 thread"])
    step_s = args.batch * cfg.context / two
    result = {
        "command": " ".join(["python bench/distributed_cpu.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "host": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs",
        "preset": args.preset, "batch": args.batch, "seq": cfg.context,
        "steps": args.steps, "warmup": args.warmup, "params": n,
        "runs": runs,
        "summary": {
            "one_process_tokens_per_s_median": one,
            "two_ranks_tokens_per_s_median": two,
            "speedup": two / one,
            "allreduce_seconds_median": ar,
            "allreduce_share_of_step": ar / step_s,
        },
        "mpi": "MPICH (pip wheel), mpi4py Allreduce in place, float32",
        "python": platform.python_version(),
    }  # fmt: skip
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
