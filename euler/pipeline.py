"""`euler pipeline`: raw data to a pretrained and fine-tuned model, scored, in one folder.

The stages are the README's commands, run in this process through the `euler` app itself
(`run_command`, given by the CLI), so the report's commands are exactly what ran:

    data        euler data prepare      books + web text -> tokenizer and token shards
    sft data    euler data prepare-sft  the instruction records, with that tokenizer
    pretrain    euler train
    sft         euler sft
    eval text   euler eval --text       held-out bits per byte of the pretrained model
    eval instr  euler eval --instructions  greedy answers of the fine-tuned model
    plot        euler plot              loss curves (needs the plot extra; else skipped)

Every command runs inside a staging folder beside OUT (`.OUT.partial`) with relative paths,
so the folder renamed to OUT at the end is whole and its run.json files name paths that
hold there ("run from OUT"). OUT is written only when it is missing, empty, or (with
--overwrite) an earlier pipeline's folder (pipeline.json says so); the raw data may not
lie inside it. A failed pipeline removes its staging folder.

With a time budget (`minutes`), the data stages run first and take what they take; what
is left is split by BUDGET_SHARES, and the pretraining tokens, the SFT steps and the
held-out tokens scored of each source come from the training speed measured on a few
steps of the model before pretraining starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from euler import ownership
from euler.errors import EulerError

MARKER = "pipeline.json"  # the folder's kind, its settings and every number of the report
REPORT = "report.md"
# the README's pretraining recipe (10M tokens of `small`, B=16, peak lr 2e-3) and SFT steps
DEFAULT_TOKENS = 10_000_000
DEFAULT_SFT_STEPS = 300
SFT_BATCH = 8  # euler sft's default --batch-size
LR, MIN_LR, MAX_WARMUP = "2e-3", "2e-4", 200
# shares of the time left after data preparation; the rest (0.15) is evaluation and plots
BUDGET_SHARES = {"pretrain": 0.70, "sft": 0.15}
# a step's measured time leaves out validations, checkpoints and start-up: aim below it
BUDGET_SAFETY = 0.8
# of the evaluation's budget, the held-out text's share (the rest: instructions and plots)
TEXT_EVAL_SHARE = 0.5
# a forward alone scores tokens faster than a training step trains them (no backward, no
# optimizer: about a third of the work); 1.5 leaves room for a slower forward
FORWARD_SPEEDUP = 1.5
CALIBRATION_STEPS = 3


@dataclass
class Settings:
    """What `euler pipeline` was asked for (paths as given; raw: the shared data folder
    holding books/, web/ and instructions/*.json)."""

    out: Path
    raw: Path
    device: str = "cpu"
    preset: str = "small"
    vocab_size: int = 512
    batch_size: int = 16
    tokens: int | None = None  # pretraining tokens (None: the budget's, or DEFAULT_TOKENS)
    sft_steps: int | None = None
    limit: int = 0  # instructions answered (0: all held out)
    minutes: float | None = None
    overwrite: bool = False


@dataclass
class Stage:
    """One stage: its name, its commands (argv after `euler`), its time budget (seconds,
    None: unbudgeted) and, once run, its wall time."""

    name: str
    commands: list[list[str]]
    budget_s: float | None = None
    seconds: float = 0.0
    skipped: str = ""  # why a stage did not run


@dataclass
class Pipeline:
    """A pipeline in progress: the settings, the stages run so far and their numbers."""

    settings: Settings
    stages: list[Stage] = field(default_factory=list)
    results: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)


# ---------------------------------------------------------------------------- the folder


def _partial(out: Path) -> Path:
    return out.with_name(f".{out.name}.partial")


def check_out(s: Settings) -> None:
    """Refuse, before any work, an OUT that the pipeline may not write (one line)."""
    out, raw = Path(s.out), Path(s.raw)
    if not raw.is_dir():
        raise EulerError(
            f"--data-root {raw}: not a folder (the shared raw data: books/, web/, instructions/)"
        )
    for sub in ("books", "web", "instructions"):
        if not (raw / sub).is_dir():
            raise EulerError(f"--data-root {raw}: has no {sub}/ folder")
    if not _instruction_files(raw):
        raise EulerError(f"--data-root {raw}: instructions/ holds no .json file")
    if out.exists() and not out.is_dir():
        raise EulerError(f"--out {out}: is a file ({ownership.identify(out).words}), not a folder")
    for inside in (ownership._inside(raw, out), ownership._inside(out, raw)):
        if inside:
            raise EulerError(
                f"--out {out} and --data-root {raw} overlap: the pipeline never "
                "writes where its input lies"
            )
    ownership.check_writable(out)
    found = ownership.identify(out)
    if found is ownership.NOTHING:
        return
    if found.kind is not ownership.PIPELINE:
        raise EulerError(
            f"--out {out}: holds {found.words}, not a pipeline's folder: never replaced"
        )
    if not s.overwrite:
        raise EulerError(f"--out {out}: holds an earlier pipeline (give --overwrite to replace it)")


@contextlib.contextmanager
def staging(s: Settings) -> Iterator[Path]:
    """A fresh staging folder beside OUT, as the working directory; renamed to OUT when
    the block ends well (an earlier pipeline's OUT replaced), removed when it fails."""
    out = Path(s.out).absolute()
    tmp = _partial(out)
    _remove_stale(tmp)
    tmp.mkdir(parents=True)
    _write_json(tmp / MARKER, {"report": "euler pipeline", "pid": os.getpid()})
    cwd = Path.cwd()
    ok = False
    try:
        os.chdir(tmp)
        yield tmp
        ok = True
    finally:
        os.chdir(cwd)
        if not ok:
            shutil.rmtree(tmp, ignore_errors=True)
    old = out.with_name(f".{out.name}.old")
    if out.exists():  # checked by check_out: empty, or a pipeline's folder and --overwrite
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale(tmp: Path) -> None:
    """Remove the staging folder of a pipeline that was killed; refuse a live one's."""
    if not tmp.exists():
        return
    try:
        pid = json.loads((tmp / MARKER).read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EulerError(f"{tmp}: is in the way and is no pipeline's staging folder") from None
    with contextlib.suppress(ProcessLookupError, PermissionError, OverflowError, TypeError):
        os.kill(pid, 0)
        if pid != os.getpid():
            raise EulerError(f"{tmp}: another pipeline (pid {pid}) is writing there")
    shutil.rmtree(tmp)


def _write_json(path: Path, obj: dict) -> None:
    from euler.data.files import write_json_atomic

    write_json_atomic(path, obj)


# ---------------------------------------------------------------------------- the stages


def _instruction_files(raw: Path) -> list[str]:
    return sorted(glob.glob(str(raw / "instructions" / "*.json")))


def data_stages(s: Settings, context: int) -> list[Stage]:
    """The two preparation stages (paths relative to the staging folder)."""
    raw = Path(s.raw).absolute()
    prepare = [
        "data",
        "prepare",
        "--books",
        str(raw / "books"),
        "--web",
        str(raw / "web"),
        "--vocab-size",
        str(s.vocab_size),
        "--out",
        "data/pretrain",
    ]
    sft = [
        "data",
        "prepare-sft",
        *_instruction_files(raw),
        "--tokenizer",
        "data/pretrain",
        "--out",
        "data/sft",
        "--seq-len",
        str(context),
    ]
    return [Stage("data", [prepare]), Stage("sft data", [sft])]


def training_stages(
    s: Settings, context: int, tokens: int, sft_steps: int, budgets: dict[str, float | None],
    text_tokens: int = 0,
) -> list[Stage]:  # fmt: skip
    """Pretraining, SFT, the evaluations (text_tokens: of each held-out source, 0: all)
    and the plots."""
    steps = max(1, tokens // (s.batch_size * context))
    warmup = min(MAX_WARMUP, max(1, steps // 25))
    device = ["--device", s.device]
    train = [
        "train",
        "--data",
        "data/pretrain",
        "--out",
        "runs/pretrain",
        "--preset",
        s.preset,
        "--batch-size",
        str(s.batch_size),
        "--seq-len",
        str(context),
        "--tokens",
        str(tokens),
        "--lr",
        LR,
        "--min-lr",
        MIN_LR,
        "--warmup-steps",
        str(warmup),
        *device,
    ]
    sft = [
        "sft",
        "--checkpoint",
        "runs/pretrain",
        "--data",
        "data/sft",
        "--out",
        "runs/sft",
        "--steps",
        str(sft_steps),
        *device,
    ]
    text = [
        "eval",
        "--checkpoint",
        "runs/pretrain",
        "--text",
        "data/pretrain",
        "--json",
        "eval-text.json",
        *device,
    ]
    instr = [
        "eval",
        "--checkpoint",
        "runs/sft",
        "--instructions",
        "data/sft/val-instructions.json",
        "--json",
        "eval-instructions.json",
        *device,
    ]
    if text_tokens:
        text += ["--text-tokens", str(text_tokens)]
    if s.limit:
        instr += ["--limit", str(s.limit)]
    plots = [
        ["plot", "--checkpoint", "runs/pretrain", "--out", "loss-pretrain.png"],
        ["plot", "--checkpoint", "runs/sft", "--out", "loss-sft.png"],
    ]
    return [
        Stage("pretrain", [train], budgets.get("pretrain")),
        Stage("sft", [sft], budgets.get("sft")),
        Stage("eval text", [text], budgets.get("eval")),
        Stage("eval instructions", [instr]),
        Stage("plot", plots),
    ]


def split_budget(seconds_left: float) -> dict[str, float]:
    """The seconds of each budgeted stage, out of those left after data preparation:
    BUDGET_SHARES for training, the rest for the evaluations and plots (key "eval")."""
    budgets = {name: share * seconds_left for name, share in BUDGET_SHARES.items()}
    budgets["eval"] = seconds_left - sum(budgets.values())
    return budgets


def budgeted_counts(
    budgets: dict[str, float], tokens_per_second: float, batch_size: int, context: int
) -> tuple[int, int]:
    """(pretraining tokens, SFT steps) that fit their budgets at tokens_per_second, with
    BUDGET_SAFETY's margin; at least one step of each."""
    rate = tokens_per_second * BUDGET_SAFETY
    per_step = batch_size * context
    tokens = max(per_step, int(budgets["pretrain"] * rate) // per_step * per_step)
    sft_steps = max(1, int(budgets["sft"] * rate) // (SFT_BATCH * context))
    return tokens, sft_steps


def budgeted_text_tokens(budgets: dict[str, float], tokens_per_second: float,
                         sources: int, context: int) -> int:  # fmt: skip
    """Tokens of each held-out source that `euler eval --text-tokens` scores within the
    text's share of the evaluation budget (the whole val split is millions of tokens);
    at least one window's."""
    rate = tokens_per_second * FORWARD_SPEEDUP * BUDGET_SAFETY
    return max(context + 1, int(budgets["eval"] * TEXT_EVAL_SHARE * rate) // max(1, sources))


def measure_speed(s: Settings, vocab_size: int) -> float:
    """Training tokens per second of the model on the device: CALIBRATION_STEPS steps of a
    synthetic batch after one untimed (that one loads or compiles the kernels)."""
    from euler.backend import make_backend
    from euler.bench.steps import synthetic_batch, time_engine
    from euler.model.config import get_preset
    from euler.precision import resolve_precision

    cfg = dataclasses.replace(get_preset(s.preset), vocab_size=vocab_size)
    precision = resolve_precision(s.device, None, "train")
    be = make_backend(s.device, precision)
    tokens, targets = synthetic_batch(cfg, s.batch_size, cfg.context)
    stats = time_engine(
        cfg, be, s.device, tokens, targets, CALIBRATION_STEPS, 0, precision=precision
    )
    return s.batch_size * cfg.context / (stats["ms_per_step"] / 1e3)


def run(
    s: Settings, run_command: Callable[[list[str]], None], say: Callable[[str], None] = print
) -> dict:
    """Run the whole pipeline into s.out; returns pipeline.json's contents.

    run_command(argv) runs one `euler` command line in this process and raises EulerError
    when it fails; say() hears one line as each stage starts."""
    from euler.model.config import get_preset
    from euler.pipeline_report import collect, write_report

    check_out(s)
    # the commands run inside the staging folder: the raw data's path must not be relative
    s = dataclasses.replace(s, raw=Path(s.raw).resolve(), out=Path(s.out).absolute())
    cfg = get_preset(s.preset)
    p = Pipeline(s)
    with staging(s) as folder:
        for stage in data_stages(s, cfg.context):
            _run_stage(p, stage, run_command, say)
        budgets: dict = {}
        tokens, sft_steps = s.tokens or DEFAULT_TOKENS, s.sft_steps or DEFAULT_SFT_STEPS
        text_tokens = 0
        if s.minutes is not None:
            left = s.minutes * 60 - (time.perf_counter() - p.started)
            if left <= 0:
                raise EulerError(
                    f"--minutes {s.minutes:g}: data preparation alone took "
                    f"{(time.perf_counter() - p.started) / 60:.1f} minutes"
                )
            budgets = split_budget(left)
            say(
                f"measuring the training speed of {s.preset} on {s.device} to fit "
                f"{left / 60:.1f} minutes"
            )
            vocab = json.loads(Path("data/pretrain/tokenizer.json").read_text())["vocab_size"]
            tps = measure_speed(s, vocab)
            p.results["calibration_tokens_per_second"] = tps
            fit_tokens, fit_steps = budgeted_counts(budgets, tps, s.batch_size, cfg.context)
            tokens, sft_steps = s.tokens or fit_tokens, s.sft_steps or fit_steps
            manifest = json.loads(Path("data/pretrain/manifest.json").read_text())
            text_tokens = budgeted_text_tokens(budgets, tps, len(manifest["sources"]),
                                               cfg.context)  # fmt: skip
        plot_missing = _plot_missing()
        stages = training_stages(s, cfg.context, tokens, sft_steps, budgets, text_tokens)
        for stage in stages:
            if stage.name == "plot" and plot_missing:
                stage.skipped = plot_missing
                p.stages.append(stage)
                continue
            _run_stage(p, stage, run_command, say)
        p.results.update(collect(folder, p))
        doc = _document(p)
        _write_json(folder / MARKER, doc)
        write_report(folder / REPORT, doc)
    return doc


def _plot_missing() -> str:
    """Why the plots cannot be drawn here ('' when they can)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed: pip install -e '.[plot]'"
    return ""


def _run_stage(p: Pipeline, stage: Stage, run_command, say) -> None:
    """Run a stage's commands, timed; its wall time goes into stage.seconds."""
    import shlex

    budget = f", budget {stage.budget_s / 60:.1f} min" if stage.budget_s is not None else ""
    say(f"== {stage.name}{budget}: " + "; ".join(shlex.join(["euler", *c]) for c in stage.commands))
    t0 = time.perf_counter()
    try:
        for argv in stage.commands:
            run_command(argv)
    finally:
        stage.seconds = time.perf_counter() - t0
        p.stages.append(stage)


def _document(p: Pipeline) -> dict:
    """pipeline.json: the marker, the settings, the stages and the numbers."""
    s = p.settings
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items()}
    return {
        "report": "euler pipeline",
        "settings": settings,
        "stages": [
            {
                "name": st.name,
                "commands": st.commands,
                "seconds": st.seconds,
                "budget_seconds": st.budget_s,
                "skipped": st.skipped,
            }
            for st in p.stages
        ],
        "total_seconds": time.perf_counter() - p.started,
        "results": p.results,
    }


def finite(x) -> bool:
    """x is a number and finite (the report shows '-' otherwise)."""
    return isinstance(x, (int, float)) and math.isfinite(x)
