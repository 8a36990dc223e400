"""Training on a GPU under faults: device memory taken by another process, SIGKILL during
a CUDA-graph step, non-finite values in bf16. Run on a machine with one CUDA GPU and torch
(its memory hog), from the repository root:

    python bench/gpu_faults.py --json OUT.json

Each case runs `euler train` in its own process and records its exit status, its stderr's
last lines and what it left on disk; a case passes when the run failed in one `error:` line
(exit 2) with its newest checkpoint loadable, or, where nothing should fail, finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

HOG = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * 2**20)
x = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
left = torch.cuda.mem_get_info()[0] // 2**20
print("hog", x.numel() // 2**20, "MiB; free", left, "MiB", flush=True)
time.sleep(float(sys.argv[2]))
"""
SMALL = ["--device", "cuda", "--preset", "small", "--batch-size", "16", "--eval-every", "40",
         "--eval-batches", "2", "--sample-tokens", "0", "--log-every", "10"]  # fmt: skip


def euler(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`euler ARGS` in its own process; its exit status and output."""
    return subprocess.run([sys.executable, "-m", "euler.cli", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def hog(keep_mib: float, seconds: float) -> subprocess.Popen:
    """A process holding all the device's free memory but keep_mib, for `seconds`."""
    p = subprocess.Popen([sys.executable, "-c", HOG, str(keep_mib), str(seconds)],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    print(p.stdout.readline().strip(), flush=True)  # once it holds the memory
    return p


def tail(text: str, n: int = 3) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()][-n:]


def one_line_error(res) -> bool:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    return (
        res.returncode == 2
        and len(lines) >= 1
        and lines[-1].startswith("error: ")
        and ("Traceback" not in res.stderr)
    )


def checkpoint_ok(run: Path) -> dict:
    """Whether the run's checkpoint loads (checksum, finite values) and its step."""
    from euler.training import checkpoint

    if not (run / checkpoint.CHECKPOINT_NAME).exists():
        return {"checkpoint": None}
    try:
        return {"checkpoint": "loads", "step": checkpoint.load(run).step}
    except Exception as e:  # noqa: BLE001 - the point is to report it
        return {"checkpoint": f"fails: {e}"}


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def main(
    json_out: Annotated[Path, typer.Option("--json")] = Path("gpu-faults.json"),
    root: Annotated[Path, typer.Option()] = Path("runs/faults"),
) -> None:
    """Run every case; print and write what each did."""
    root.mkdir(parents=True, exist_ok=True)
    cases: dict = {}

    def save() -> None:  # after every case: a run cut short keeps what it finished
        report = {"report": "gpu faults", "command": " ".join(sys.argv), "cases": cases,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
        json_out.write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(cases, indent=1), flush=True)

    # 1. out of memory at the start: another process holds all but 1 GiB
    h = hog(1024, 120)
    res = euler("train", "--device", "cuda", "--preset", "gpu", "--batch-size", "32",
                "--steps", "2", "--out", str(root / "oom-start"))  # fmt: skip
    h.kill()
    cases["oom at start"] = {"exit": res.returncode, "stderr": tail(res.stderr),
                             "one_line": one_line_error(res),
                             "folder_left": sorted(os.listdir(root / "oom-start"))
                             if (root / "oom-start").exists() else None}  # fmt: skip
    save()

    # 2. memory taken after the start: everything a step needs was allocated before step 1
    run = root / "oom-mid"
    p = subprocess.Popen([sys.executable, "-m", "euler.cli", "train", *SMALL, "--steps", "200",
                          "--ckpt-every", "50", "--out", str(run)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not (run / "metrics.jsonl").exists() or len(losses(run)) < 20:
        if p.poll() is not None:
            break
        time.sleep(0.5)
    h = hog(0, 300) if p.poll() is None else None
    out, err = p.communicate(timeout=400)
    if h:
        h.kill()
    cases["memory taken mid-run"] = {"exit": p.returncode, "stderr": tail(err),
                                     "steps": max(losses(run) or {0: 0}),
                                     **checkpoint_ok(run)}  # fmt: skip
    save()

    # 3. SIGKILL during a CUDA-graph step, then --resume, against an uninterrupted run
    ref, cut = root / "kill-reference", root / "kill-resumed"
    res = euler("train", *SMALL, "--steps", "160", "--ckpt-every", "40", "--out", str(ref))
    p = subprocess.Popen([sys.executable, "-m", "euler.cli", "train", *SMALL, "--steps", "160",
                          "--ckpt-every", "40", "--out", str(cut)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while not (cut / "metrics.jsonl").exists() or max(losses(cut) or {0: 0}) < 95:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed_at = max(losses(cut))
    after_kill = checkpoint_ok(cut)
    res2 = euler("train", "--resume", str(cut))
    a, b = losses(ref), losses(cut)
    same = [s for s in a if s in b and a[s] == b[s]]
    cases["sigkill then resume"] = {
        "reference_exit": res.returncode, "killed_after_step": killed_at, **after_kill,
        "resume_exit": res2.returncode, "resume_stderr": tail(res2.stderr),
        "steps_equal_bit_for_bit": len(same), "steps_compared": len(set(a) & set(b)),
        "max_abs_difference": max((abs(a[s] - b[s]) for s in set(a) & set(b)), default=None),
    }  # fmt: skip
    save()

    # 4. non-finite values in bf16: a learning rate far too large
    run = root / "bf16-nonfinite"
    res = euler("train", *SMALL, "--precision", "bf16", "--lr", "1e4", "--warmup-steps", "0",
                "--steps", "100", "--ckpt-every", "2", "--out", str(run))  # fmt: skip
    cases["bf16 non-finite"] = {"exit": res.returncode, "stderr": tail(res.stderr),
                                "one_line": one_line_error(res), **checkpoint_ok(run)}  # fmt: skip
    save()


if __name__ == "__main__":
    typer.run(main)
