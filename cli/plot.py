"""`euler plot`: loss curves of one run, or of several runs overlaid, as a PNG."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from euler.errors import EulerError

COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:olive")


@dataclass
class Curves:
    """One run's metrics.jsonl: training loss per step, validation loss per evaluation."""

    name: str
    steps: list[int]
    losses: list[float]
    val: list[tuple[int, float, float | None]]  # (step, mean over heads, head 0)
    tokens_per_step: float


def read_curves(run: Path) -> Curves:
    """The curves of a run folder; a one-line error when it holds none."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise EulerError(f"no metrics to plot: {path} not found")
    steps, losses, val, per_step = [], [], [], 0.0
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if "loss" in r:
            steps.append(r["step"])
            losses.append(r["loss"])
            per_step = r["tokens"] / r["step"]
        elif "val_loss" in r:
            val.append((r["step"], r["val_loss"], r.get("val_loss_heads", [None])[0]))
    if not steps:
        raise EulerError(f"{path} holds no training steps yet")
    return Curves(Path(run).name, steps, losses, val, per_step)


def smoothed(losses: list[float], decay: float = 0.95) -> list[float]:
    """Exponential moving average, debiased as Adam's moments so that it starts at x[0]."""
    out, ema = [], 0.0
    for i, x in enumerate(losses, 1):
        ema = decay * ema + (1.0 - decay) * x
        out.append(ema / (1.0 - decay**i))
    return out


def plot_runs(runs: list[Path], out: Path) -> Path:
    """Training loss (per step and smoothed) and validation loss against the step, as a PNG.

    One run: its train, validation and head-0 validation curves. Several: one colour per
    run, over the steps every run reached (so curves of unequal length compare step by step).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EulerError("euler plot needs matplotlib: pip install -e '.[plot]'") from None
    curves = [read_curves(r) for r in runs]
    last = min(c.steps[-1] for c in curves)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for c, color in zip(curves, itertools.cycle(COLORS), strict=False):
        n = sum(1 for s in c.steps if s <= last)
        label = "train" if len(curves) == 1 else c.name
        ax.plot(c.steps[:n], c.losses[:n], color=color, alpha=0.2, lw=0.8)
        ax.plot(c.steps[:n], smoothed(c.losses)[:n], color=color, lw=1.5,
                label=f"{label} (EMA 0.95)")  # fmt: skip
        val = [v for v in c.val if v[0] <= last]
        if val:
            vs, vl, v0 = zip(*val, strict=True)
            ax.plot(vs, vl, "o--", color="tab:orange" if len(curves) == 1 else color, ms=3,
                    label="validation" if len(curves) == 1 else f"{c.name} validation")  # fmt: skip
            if len(curves) == 1 and None not in v0:
                ax.plot(vs, v0, "s--", color="tab:green", ms=3,
                        label="validation, head 0 (next token)")  # fmt: skip
    names = " vs ".join(c.name for c in curves)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over the MTP heads, nats)")
    ax.set_title(f"{names}: {curves[0].tokens_per_step:,.0f} tokens per step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
