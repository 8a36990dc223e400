"""Where a run starts: a fresh run claims its folder, a resumed one loads its checkpoint
after checking that the checkpoint and the flags given can continue the run run.json
describes. Called by euler.training.loop under the run folder's lock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from euler.errors import EulerError
from euler.schema import MISSING, Fields, describe
from euler.training import checkpoint, run_folder
from euler.training.config import RESUME_FLAGS, TrainConfig, flag_name
from euler.training.run_folder import METRICS_FILE, RunInfo

if TYPE_CHECKING:
    from euler.training.loop import RunState


def start_fresh(r: RunState, overwrite: bool, init: checkpoint.Checkpoint | None) -> None:
    """Claim the run folder and write run.json; SFT starts from init's weights."""
    if r.comm.rank == 0:  # the other ranks never write to the run folder
        run_folder.claim_run_dir(r.folder, overwrite, run_inputs(r.tc))
        r.run_id = run_folder.new_run_id()
        settings = getattr(r.model.be, "settings", None)  # the GPU backend's options
        info = RunInfo(r.run_id, r.tc, r.cfg, r.data.identity, settings and settings())
        run_folder.write_run_files(r.folder, info, r.tokenizer_json)
    if init is not None:
        r.model.be.copy_(r.model.params, init.params.astype(r.model.dtype))


def run_inputs(tc: TrainConfig) -> list[tuple[str, Path]]:
    """The (flag, path) of what a fresh run reads, which its folder may not hold."""
    reads = [("--data", Path(tc.data))] if tc.data else []
    return reads + ([("--checkpoint", Path(tc.init_from))] if tc.init_from else [])


def resume_run(r: RunState, log: Callable) -> None:
    """Load the run's checkpoint (weights, moments, step), or start at step 0 without one;
    refuse a checkpoint of another run or settings run.json does not allow to change; drop
    the metrics logged after the checkpoint and the temporary files of a killed save."""
    run, be = r.folder, r.model.be
    info = run_folder.read_run_info(run)
    check_resumed_settings(info.train, r.tc, run)
    check_same_data(info, r.data.identity, run)
    r.run_id = info.run_id
    ck = None
    if (run / checkpoint.CHECKPOINT_NAME).exists():
        ck = checkpoint.load(run)
        check_resumable(r, ck, info)
        be.copy_(r.model.params, ck.params)
        be.copy_(r.opt.m, ck.moments["m"])
        be.copy_(r.opt.v, ck.moments["v"])
        r.opt.step_count = ck.state["adam_step"]
        r.start = r.saved_step = ck.step
    if r.comm.rank == 0:
        run_folder.remove_temp_files(run)
        if r.tc != info.train:  # a longer --steps, another --ckpt-every: run.json says so
            run_folder.write_run_files(run, RunInfo(info.run_id, r.tc, info.model, info.data))
        run_folder.trim_metrics(run / METRICS_FILE, r.start if ck else -1)
    if ck is None:
        log(f"{run} has no checkpoint yet: starting it from step 0")
    else:
        log(f"resuming {run} at step {r.start}")


def check_same_data(info: RunInfo, now: dict, run: Path) -> None:
    """Refuse to continue a run on data other than the data it started on (the manifest's
    SHA-256 that run.json recorded), saying what changed."""
    from euler.data.manifest import identity_change

    if info.data is None:
        return  # a run started before the data was recorded
    change = identity_change(info.data, now)
    if change is not None:
        raise EulerError(
            f"{now['folder']}: not the data {run / run_folder.RUN_FILE} started on: {change}; "
            "resume on the data it started on, or start a new run"
        )


def check_resumed_settings(saved: TrainConfig, tc: TrainConfig, run: Path) -> None:
    """Refuse settings for a resumed run that differ from its run.json's, but for those
    --resume may change (RESUME_FLAGS) and the folder itself (it may have moved)."""
    fixed = [f.name for f in dataclasses.fields(TrainConfig)
             if f.name not in (*RESUME_FLAGS, "out_dir")]  # fmt: skip
    changed = [flag_name(name) for name in fixed if getattr(saved, name) != getattr(tc, name)]
    if changed:
        raise EulerError(
            f"{run / run_folder.RUN_FILE} holds the settings of the run; resuming cannot "
            f"change {', '.join(changed)}"
        )


def check_resumable(r: RunState, ck: checkpoint.Checkpoint, info: RunInfo) -> None:
    """Refuse a checkpoint that cannot continue this run: another architecture, another
    run's (its run id), weights only, another tokenizer, or past the run's last step."""
    run = r.folder
    checkpoint.check_compatible(ck, r.cfg, f"run {run}")
    if ck.moments is None:  # first: an export or weights-only save has no run id either
        raise EulerError(
            f"--resume {run}: {ck.path} holds weights only (no AdamW moments); it cannot "
            "resume training: start a run from it with `euler sft --checkpoint`"
        )
    state = Fields(ck.state, str(ck.path), "state")
    found = state.get("run_id", MISSING)
    if found != info.run_id:
        raise EulerError(
            f"{ck.path}: state.run_id: expected {info.run_id!r} (the run id in "
            f"{run / run_folder.RUN_FILE}), found {describe(found)}: the checkpoint is "
            "another run's"
        )
    state.int("adam_step", lo=0)
    if ck.tokenizer_sha256 != r.data.tokenizer.sha256:
        raise EulerError(f"{ck.path} was trained with another tokenizer than {r.data.folder}'s")
    if ck.step > r.total:
        raise EulerError(
            f"--steps {r.tc.steps}: {ck.path} is at step {ck.step} already; "
            f"give --steps {ck.step} or more"
        )
