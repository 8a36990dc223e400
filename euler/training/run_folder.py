"""The run folder: its files, its lock, claiming one for a fresh run, reading back a run.

run.json                 the run's id, the TrainConfig and the model config it runs with
checkpoint.safetensors   weights, AdamW moments, step, loader/RNG state, tokenizer, run id
tokenizer.json           a copy of the tokenizer, for the user's convenience
metrics.jsonl            one JSON object per step (loss, lr, grad norm, tokens/s) and per
                         evaluation (val_loss, a short text sample)
.lock                    held (flock) by the one process that trains into the folder; it
                         holds that process's PID

Every file but metrics.jsonl is replaced whole through a temporary `.NAME.*.tmp` beside it
and a rename, so a kill leaves the old file or the new one; the next run to take the lock
removes the temporary files a killed writer left.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from euler import ownership
from euler.data.files import acquire_lock, lock_holder, release_lock
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.schema import Fields, read_json
from euler.training import checkpoint
from euler.training.config import TrainConfig

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_FILE = "tokenizer.json"
LOCK_FILE = ".lock"
RUN_FILES = (RUN_FILE, checkpoint.CHECKPOINT_NAME, METRICS_FILE, TOKENIZER_FILE)
KEPT_PATTERN = "checkpoint-*.safetensors"  # --keep-every and --keep-best copies


def kept_name(step: int | None) -> str:
    """A kept checkpoint's file name: of step `step` (--keep-every), or the best (None)."""
    return (
        "checkpoint-best.safetensors" if step is None else f"checkpoint-step{step:07d}.safetensors"
    )


def is_run_file(name: str) -> bool:
    """Whether a file of this name in a run folder is the run's own."""
    return name in RUN_FILES or fnmatch.fnmatchcase(name, KEPT_PATTERN)


def run_file_names(run: Path) -> list[str]:
    """The run's files: RUN_FILES, then the kept checkpoints the folder holds."""
    return [*RUN_FILES, *sorted(p.name for p in run.glob(KEPT_PATTERN))]


@dataclass(frozen=True)
class RunInfo:
    """What run.json says: the run's id (also in each of its checkpoints) and its configs."""

    run_id: str
    train: TrainConfig
    model: ModelConfig
    data: dict | None = None  # the data folder it started on (manifest.data_identity)
    backend: dict | None = None  # what its GPU backend did (GpuBackend.settings); None on a CPU


# ---------------------------------------------------------------------------- the lock

_held: dict[str, list] = {}  # folder's real path -> [lock fd, depth]: this process's locks


@contextlib.contextmanager
def lock_run(run: Path, create: bool, owner: bool = True) -> Iterator[None]:
    """Hold the run folder's lock for the block: one process trains into a folder at a time.

    create: make a missing folder (a fresh run), removed again at the end if still empty;
    else a missing folder is an error. owner False (MPI ranks other than 0) takes nothing:
    rank 0 holds the lock for the ranks of its run. The same process may nest the block
    (the CLI holds it while it reads run.json, train() again for the run). The OS drops
    the lock of a process that dies; the file it leaves is taken over by the next run.
    """
    if not owner:
        yield
        return
    from euler.ownership import check_writable

    run = Path(run)
    # the user's folder named, never the lock file inside it
    check_writable(run, "--out" if create else "--resume", above=create)
    made = False
    if create:
        try:
            run.mkdir(parents=True)
            made = True
        except FileExistsError:  # a folder already (or another process made it first)
            pass
    check_folder(run)
    key = os.path.realpath(run)
    if key in _held:
        _held[key][1] += 1
    else:
        _held[key] = [_acquire(run), 1]
    try:
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            fd, _ = _held.pop(key)
            release_lock(run / LOCK_FILE, fd)
            if made:
                with contextlib.suppress(OSError):  # not empty: the run wrote its files
                    run.rmdir()


def _acquire(run: Path) -> int:
    """Take RUN/.lock (flock, not waiting) and write our PID in it; refuse a held one."""
    return acquire_lock(run / LOCK_FILE, _busy(run))


def _busy(run: Path) -> str:
    return f"{run} is in use by another run"


def check_folder(run: Path) -> None:
    """Refuse a run folder that is missing or is a file."""
    if run.is_file():
        raise EulerError(f"{run}: is a file, expected a run folder")
    if not run.is_dir():
        raise EulerError(f"{run}: run folder not found")


# ---------------------------------------------------------------------------- writing


def new_run_id() -> str:
    """A fresh run's id: written in run.json and in every checkpoint of the run."""
    return secrets.token_hex(8)


def write_atomic(path: Path, text: str) -> None:
    """Replace the text file `path` through a temporary file beside it and a rename."""
    checkpoint.write_atomic(path, text.encode("utf-8"), what=path.name)


def remove_temp_files(run: Path) -> None:
    """Remove the temporary files a killed save left in the run folder (`.NAME.*.tmp`)."""
    for name in (*RUN_FILES, KEPT_PATTERN):
        for tmp in run.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def check_run_dir(run: Path, overwrite: bool, reads: Iterable[tuple[str, Path]] = ()) -> bool:
    """Refuse a folder a fresh run may not take (euler.ownership's rule): one that holds a
    run unless overwrite, one of another kind or holding run files but no run.json, one
    that holds an input (reads); a refused folder that another run trains in now is named
    so, with its PID. True when it holds a run to replace."""
    try:
        replace = ownership.claim_folder(run, ownership.RUN, overwrite, reads,
                                         foreign_ok=RUN_FILES)  # fmt: skip
    except EulerError:
        holder = lock_holder(run / LOCK_FILE)
        if holder is not None:  # a run trains there now: --resume would be refused too
            raise EulerError(f"{_busy(run)} (PID {holder})") from None
        if overwrite or ownership.identify(run).kind is not ownership.RUN:
            raise
        what = "a run"
        with contextlib.suppress(EulerError):
            tc = read_run(run)[0]
            what = f"a {tc.kind} run ({tc.preset} preset)"
        raise EulerError(
            f"--out {run} already holds {what}; continue it with --resume {run}, "
            "or pass --overwrite to replace it"
        ) from None
    return replace


def claim_run_dir(run: Path, overwrite: bool, reads: Iterable[tuple[str, Path]] = ()) -> None:
    """Make a locked folder a fresh run's: check_run_dir, then clear the run it replaces
    and the temporary files a killed run left."""
    if check_run_dir(run, overwrite, reads):
        for name in run_file_names(run):
            (run / name).unlink(missing_ok=True)
    remove_temp_files(run)
    _claimed.add(os.path.realpath(run))


_claimed: set[str] = set()  # run folders this process claimed for a fresh run


def undo_start(run: Path) -> None:
    """Remove what a fresh run that failed before its first checkpoint wrote (run.json,
    the tokenizer copy, metrics), so the folder holds no run to refuse a rerun over; only
    in a folder this process claimed. A run with a checkpoint is kept: it can resume."""
    key = os.path.realpath(run)
    if key not in _claimed:
        return
    _claimed.discard(key)
    if (run / checkpoint.CHECKPOINT_NAME).exists():
        return
    for name in run_file_names(run):
        (run / name).unlink(missing_ok=True)
    remove_temp_files(run)


def forget_claim(run: Path) -> None:
    """The run in `run` is no longer starting (it ended, or undo_start removed it)."""
    _claimed.discard(os.path.realpath(run))


def write_run_files(run: Path, info: RunInfo, tokenizer_json: str | None = None) -> None:
    """run.json (the run's id and settings) and, given one, the tokenizer copy."""
    doc = {"run_id": info.run_id, "train": info.train.to_dict(), "model": info.model.to_dict()}
    if info.data is not None:
        doc["data"] = info.data
    if info.backend is not None:
        doc["backend"] = info.backend
    write_atomic(run / RUN_FILE, json.dumps(doc, indent=2) + "\n")
    if tokenizer_json is not None:
        write_atomic(run / TOKENIZER_FILE, tokenizer_json)


# ---------------------------------------------------------------------------- reading


def read_run_info(run: Path) -> RunInfo:
    """What RUN/run.json says, every field checked; one line naming the field if not."""
    path = Path(run) / RUN_FILE
    if Path(run).is_dir() and not path.exists():
        raise EulerError(f"{run} is not a run folder (no {RUN_FILE})")
    f = Fields(read_json(path, "run file"), str(path))
    f.only(("run_id", "train", "model", "data", "backend"))
    run_id = f.str("run_id")
    if not run_id.isalnum():
        f.fail("run_id", "letters and digits", run_id)
    model = f.obj("model")  # refuses a non-object before ModelConfig reads it
    data = None
    if f.has("data"):  # absent in runs started before it was recorded
        d = f.obj("data")
        data = {"folder": d.str("folder"), "manifest_sha256": d.str("manifest_sha256"),
                "tokenizer_sha256": d.str("tokenizer_sha256"),
                "files": {k: d.obj("files").str(k) for k in d.obj("files").data}}  # fmt: skip
    backend = None
    if f.has("backend"):  # absent in runs started before it was recorded, and on a CPU
        b = f.obj("backend")
        for key, value in b.data.items():
            if not isinstance(value, (bool, int, float, str)):
                b.fail(key, "a number, boolean or string", value)
        backend = dict(b.data)
    return RunInfo(
        run_id,
        TrainConfig.from_fields(f.obj("train")),
        ModelConfig.from_dict(model.data, f"{path}: model"),
        data,
        backend,
    )


def read_run(run: Path) -> tuple[TrainConfig, ModelConfig]:
    """The TrainConfig and ModelConfig a run folder runs with."""
    info = read_run_info(run)
    return info.train, info.model


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop metrics past the checkpoint's step (all: last_step -1); a resumed run logs
    those steps again. A line that is not a step's record (cut short by a kill) goes too."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and step <= last_step:
            keep.append(line)
    write_atomic(path, "".join(line + "\n" for line in keep))
