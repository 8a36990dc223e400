"""`euler plot`: loss curves of one run, or of several runs overlaid, as a PNG.

The headline is next-token loss (head 0's validation loss), the number other projects
report; the training objective, the mean over the MTP heads, is drawn beside it and says so
in its label (a step's training record holds only that mean).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from euler import ownership
from euler.data.files import atomic_open
from euler.errors import EulerError
from euler.schema import Fields, parse_json

COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:olive")


@dataclass
class Curves:
    """One run's metrics.jsonl: training loss per step, validation loss per evaluation."""

    name: str
    steps: list[int]
    losses: list[float]
    val: list[tuple[int, float, float | None]]  # (step, mean over heads, head 0)
    tokens_per_step: float
    heads: int = 0  # K, the MTP heads the validation records name (0: none recorded)


@dataclass
class Series:
    """One line of the plot: its label, points and matplotlib style."""

    label: str
    steps: list[int]
    values: list[float]
    color: str
    style: str = "-"  # matplotlib's format string
    alpha: float = 1.0
    width: float = 1.5


def read_curves(run: Path) -> Curves:
    """The curves of a run folder; a one-line error naming the file and line of a record
    that is not one of a run's (a last line cut short by a kill is left out)."""
    path = Path(run) / "metrics.jsonl"
    if Path(run).is_file():
        raise EulerError(f"{run}: is a file, expected a run folder")
    if not path.is_file():
        raise EulerError(f"no metrics to plot: {path} not found")
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise EulerError(f"{path}: cannot read ({e.strerror})") from None
    steps, losses, val, per_step, K = [], [], [], 0.0, 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            r = Fields(parse_json(line, where), where)
        except EulerError:
            if i == len(lines):  # no newline after it: a write cut short
                break
            raise
        if r.has("loss"):
            after = steps[-1] if steps else 0
            step = r.int("step", lo=after + 1)
            steps.append(step)
            losses.append(r.float("loss"))
            per_step = r.int("tokens", lo=0) / step
        elif r.has("val_loss"):
            step = r.int("step", lo=0)
            if r.get("val_loss") is not None:  # null: the evaluation was not finite
                heads = r.list("val_loss_heads", default=[None])
                head0 = heads[0] if heads and isinstance(heads[0], (int, float)) else None
                val.append((step, r.float("val_loss"), head0))
                K = len(heads) if head0 is not None else K
        else:
            r.fail("", "a step's record (loss) or an evaluation's (val_loss)", r.data)
    if not steps:
        raise EulerError(f"{path} holds no training steps yet")
    return Curves(Path(run).name, steps, losses, val, per_step, K)


def check_out(out: Path) -> Path:
    """Refuse a --out that is not a .png path in an existing folder, or that holds anything
    but a plot euler plot wrote (euler.ownership's rule; a plot is replaced without
    --overwrite: plotting again is how a plot is updated)."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise EulerError(f"--out must be a .png file, got {out}")
    if out.is_dir():
        raise EulerError(f"--out {out} is a folder, expected a .png file")
    if not out.parent.is_dir():
        raise EulerError(f"--out {out}: folder {out.parent} not found")
    ownership.claim_file(out, ownership.PLOT, True)
    return out


def smoothed(losses: list[float], decay: float = 0.95) -> list[float]:
    """Exponential moving average, debiased as Adam's moments so that it starts at x[0]."""
    out, ema = [], 0.0
    for i, x in enumerate(losses, 1):
        ema = decay * ema + (1.0 - decay) * x
        out.append(ema / (1.0 - decay**i))
    return out


def title(curves) -> str:
    """The plot's title: next-token loss, the runs' names and each one's own tokens per
    step (one figure when they share it; an SFT run overlaid on its pretraining steps names
    its own)."""
    sizes = {c.tokens_per_step for c in curves}
    if len(sizes) == 1:
        names = " vs ".join(c.name for c in curves)
        return f"next-token loss, {names}: {sizes.pop():,.0f} tokens per step"
    each = " vs ".join(f"{c.name} ({c.tokens_per_step:,.0f} tokens/step)" for c in curves)
    return f"next-token loss, {each}"


def _objective(c: Curves) -> str:
    """What a run's training loss is: next-token loss with one head, else the heads' mean."""
    return "next token" if c.heads == 1 else "mean of the MTP heads"


def series(curves: list[Curves]) -> list[Series]:
    """The lines of the plot, over the steps every run reached (so curves of unequal length
    compare step by step). Per run: validation next-token loss (head 0, the headline), the
    validation mean over the MTP heads, and the training loss (the objective: the heads'
    mean) raw and smoothed; one colour per run when several are overlaid."""
    last = min(c.steps[-1] for c in curves)
    one = len(curves) == 1
    out = []
    for c, color in zip(curves, itertools.cycle(COLORS), strict=False):
        name = "" if one else f"{c.name}: "
        n = sum(1 for s in c.steps if s <= last)
        train = f"{name}training, {_objective(c)}"
        out.append(Series(train, c.steps[:n], c.losses[:n], color, alpha=0.2, width=0.8))
        out.append(Series(f"{train} (EMA 0.95)", c.steps[:n], smoothed(c.losses)[:n], color))
        val = [v for v in c.val if v[0] <= last]
        if not val:
            continue
        steps = [v[0] for v in val]
        if all(v[2] is not None for v in val):
            out.append(Series(f"{name}validation, next token (head 0)", steps,
                              [v[2] for v in val], "tab:green" if one else color, "s-",
                              width=2.0))  # fmt: skip
        if c.heads != 1:  # with one head its mean is head 0's loss, drawn already
            out.append(Series(f"{name}validation, mean of the MTP heads", steps,
                              [v[1] for v in val], "tab:orange" if one else color, "o--",
                              width=1.0))  # fmt: skip
    return out


def plot_runs(runs: list[Path], out: Path) -> Path:
    """Next-token validation loss, with the MTP heads' mean and the training loss beside it
    (series()), against the step, as a PNG; several runs overlaid, one colour each."""
    curves = [read_curves(r) for r in runs]  # bad input is refused before the import
    out = check_out(out)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EulerError("euler plot needs matplotlib: pip install -e '.[plot]'") from None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in series(curves):
        raw = s.alpha < 1.0  # the raw training loss: drawn faint, unlabelled
        ax.plot(s.steps, s.values, s.style, color=s.color, alpha=s.alpha, lw=s.width, ms=3,
                label=None if raw else s.label)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("next-token loss (nats); the MTP mean where labelled", fontsize=9)
    ax.set_title(title(curves))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:  # a kill leaves the old plot or the new one
        with atomic_open(out, "wb") as f:
            fig.savefig(f, format="png", dpi=120,
                        metadata={"Software": ownership.PLOT_SOFTWARE})  # fmt: skip
    finally:
        plt.close(fig)
    return out
