"""The run folder: its files, claiming one for a fresh run, reading back how a run started.

run.json                 the TrainConfig and the model config the run was started with
checkpoint.safetensors   weights, AdamW moments, step, loader/RNG state, tokenizer (atomic)
tokenizer.json           a copy of the tokenizer, for the user's convenience
metrics.jsonl            one JSON object per step (loss, lr, grad norm, tokens/s) and per
                         evaluation (val_loss, a short text sample)
"""

from __future__ import annotations

import json
from pathlib import Path

from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.training import checkpoint
from euler.training.config import TrainConfig

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_FILE = "tokenizer.json"
RUN_FILES = (RUN_FILE, checkpoint.CHECKPOINT_NAME, METRICS_FILE, TOKENIZER_FILE)


def claim_run_dir(run: Path, overwrite: bool) -> None:
    """Create the run folder; refuse one that holds a run unless overwrite (then clear it)."""
    held = [name for name in RUN_FILES if (run / name).exists()]
    if held and not overwrite:
        what = "a run"
        try:
            info = json.loads((run / RUN_FILE).read_text())
            what = f"a {info['train']['kind']} run ({info['train']['preset']} preset)"
        except (OSError, ValueError, KeyError, TypeError):
            pass
        raise EulerError(
            f"{run} already holds {what}; continue it with --resume {run}, "
            "or pass --overwrite to replace it"
        )
    for name in held:
        (run / name).unlink()
    run.mkdir(parents=True, exist_ok=True)


def write_run_files(run: Path, tc: TrainConfig, cfg: ModelConfig, tokenizer_json: str) -> None:
    """run.json (how the run starts) and the tokenizer copy, in a claimed run folder."""
    (run / RUN_FILE).write_text(
        json.dumps({"train": tc.to_dict(), "model": cfg.to_dict()}, indent=2) + "\n"
    )
    (run / TOKENIZER_FILE).write_text(tokenizer_json, encoding="ascii")


def read_run(run: Path) -> tuple[TrainConfig, ModelConfig]:
    """The TrainConfig and ModelConfig a run folder was started with."""
    try:
        info = json.loads((run / RUN_FILE).read_text())
        return (
            TrainConfig.from_dict(info["train"], f"{run / RUN_FILE}"),
            ModelConfig.from_dict(info["model"], f"{run / RUN_FILE}"),
        )
    except FileNotFoundError:
        raise EulerError(f"{run} is not a run folder (no {RUN_FILE})") from None
    except (ValueError, KeyError, TypeError) as e:
        raise EulerError(f"{run / RUN_FILE} is corrupt ({e})") from None


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop metrics past the checkpoint's step (all: last_step -1); a resumed run logs
    those steps again."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
    path.write_text("".join(line + "\n" for line in keep))
