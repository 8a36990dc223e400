"""How far two training runs' losses are apart, over the steps both reached.

    python bench/compare_runs.py docs/gpu-curves/tf32-attention docs/gpu-curves/exact-attention

Prints, for run A minus run B: the per-step training loss difference (mean, standard
deviation), the largest gap between their smoothed curves (EMA 0.95, as `euler plot`
draws), the validation losses at the evaluations both made, and each run's time in steps
and median tokens/s.
docs/gpu-loss-curves.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from euler.cli.plot import read_curves, smoothed


def step_speed(run: Path) -> tuple[float, float]:
    """(seconds the run spent in training steps, median tokens/s of a step)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    per_step = [r for r in rows if "loss" in r]
    size = per_step[0]["tokens"] / per_step[0]["step"]
    rates = [r["tok_s"] for r in per_step]
    return sum(size / x for x in rates), float(np.median(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = read_curves(args.a), read_curves(args.b)
    n = min(len(a.losses), len(b.losses))
    diff = np.array(a.losses[:n]) - np.array(b.losses[:n])
    ema = np.array(smoothed(a.losses)[:n]) - np.array(smoothed(b.losses)[:n])
    print(f"steps: {a.name} {a.steps[-1]}, {b.name} {b.steps[-1]}; compared 1..{n}")
    print(f"loss {a.name} - {b.name}: mean {diff.mean():+.4f}, sd {diff.std():.4f}; "
          f"smoothed curves at most {np.abs(ema).max():.4f} apart")  # fmt: skip
    vb = {s: (v, h) for s, v, h in b.val}
    for s, v, h in a.val:
        if s in vb:
            print(f"step {s}: val {v:.4f} ({h:.4f}) vs {vb[s][0]:.4f} ({vb[s][1]:.4f}), "
                  f"difference {v - vb[s][0]:+.4f}")  # fmt: skip
    for run in (args.a, args.b):
        seconds, median = step_speed(run)
        print(f"{run.name}: {seconds:.1f} s in training steps, median {median:,.0f} tokens/s")


if __name__ == "__main__":
    main()
