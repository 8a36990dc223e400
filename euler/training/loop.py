"""Pretraining and SFT: the training loop, read top to bottom in train().

train() builds the run (model config, backend, data, model, AdamW, the run folder: see
euler/training/run_folder.py), then repeats the optimizer step: forward and backward over
grad_accum micro-batches, one all-reduce, the clipped AdamW update; it evaluates, logs and
checkpoints on a schedule, and stops at the end, on Ctrl-C or on a loss that is not finite.

Determinism, which makes resume exact: the batch of step s, micro-batch a is drawn from
(seed, s * grad_accum + a) alone, the learning rate is a function of s, the evaluation
batches are fixed, and the text sample at step s draws from (seed, s). So the state to save
is just the parameters, the moments, the AdamW step count and s; a run resumed from step s
repeats, bit for bit, the losses of the run that was never interrupted.

One process owns a run folder: train() holds its lock (run_folder.lock_run) from before
it reads or claims the folder until it returns.

Checkpoints hold parameters whose loss was seen finite. The loss of step s + 1 is the loss
of the parameters after step s, so a checkpoint due after step s is copied to the host then
and written once step s + 1's loss and gradient norm come out finite; the last one, and one
written on Ctrl-C, once the validation loss of its parameters does. A loss or gradient
norm that is not finite stops the run (an EulerError: exit status 2) naming the step, and
the checkpoint on disk stays the newest whose loss was finite: resumed, it repeats finite
steps.

Ctrl-C finishes the current step, saves a checkpoint and stops (a second Ctrl-C stops at
once, keeping the last checkpoint).

Data parallel (started under mpiexec; euler.training.distributed): every rank draws the global batch
and trains on its block of rows; one all-reduce averages the flat gradient buffer, so every
rank takes the same optimizer step. Rank 0 owns the run folder (logs, metrics,
checkpoints); all ranks start from rank 0's parameters and moments, and each evaluates the
whole validation batches itself. The batches, losses and checkpoints do not depend on the
number of ranks, so a run may resume on another.

CUDA graphs (euler/training/step_graph.py): each step stages its inputs from the host (the batch,
the learning rate) and then runs device work only, the forward and backward of each
micro-batch and the clipped AdamW update; on a GPU those are captured once and replayed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numba
import numpy as np

from euler.backend import Backend, make_backend
from euler.cache import kernels_compiled, last_compile_seconds, record_compile_seconds
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.transformer import Model, arena_bytes
from euler.precision import check_bf16_sequence
from euler.training import checkpoint, distributed, run_folder, step_graph
from euler.training.batches import Batches
from euler.training.config import TrainConfig, lr_at
from euler.training.evaluation import EVAL_SEED, evaluate, text_sample
from euler.training.events import EventLog, check_event_dir
from euler.training.optim import AdamW, AdamWConfig
from euler.training.resume import resume_run, start_fresh
from euler.training.run_folder import METRICS_FILE
from euler.training.terminal import FIRST_STEP_EXTRA, Display, StopRequest, compile_notice

MEMORY_SLACK = 512 * 2**20  # cuBLAS workspace, kernel scratch, allocator rounding


# ---------------------------------------------------------------------------- device


def check_device_memory(
    backend: Backend, cfg: ModelConfig, B: int, T: int, precision: str = "fp32"
) -> None:
    """Refuse, before the first step, a micro-batch whose activations do not fit on the device.

    Runs after the parameters and optimizer state are allocated, so the free memory the
    backend reports is what the activations can have (a CPU backend reports none: no check).
    """
    free = backend.free_memory()
    if free is None:
        return
    need = arena_bytes(cfg, np.float32, B, T, precision) + MEMORY_SLACK
    if need > free:
        raise EulerError(
            f"--batch-size {B} x --seq-len {T} needs {need / 2**20:.1f} MiB of device memory "
            f"for activations and scratch, {free / 2**20:.1f} MiB is free: lower --batch-size "
            "(--grad-accum keeps the tokens per step) or --seq-len"
        )


# ---------------------------------------------------------------------------- training


@dataclass
class _Snapshot:
    """A checkpoint's contents on the host, waiting for the loss of its parameters."""

    step: int
    params: np.ndarray | None  # None on ranks other than 0, which never write
    moments: dict[str, np.ndarray] | None
    state: dict


@dataclass
class RunState:
    """One run's pieces, as train() and its parts use them."""

    tc: TrainConfig
    folder: Path
    comm: distributed.Comm
    cfg: ModelConfig
    data: Batches
    model: Model
    opt: AdamW
    tokenizer_json: str
    total: int  # optimizer steps of the whole run
    tokens_per_step: int
    run_id: str = ""  # in run.json and in each checkpoint (rank 0)
    start: int = 0  # the step this process starts from
    saved_step: int | None = None  # the step of the checkpoint on disk
    pending: _Snapshot | None = None  # a checkpoint waiting for the next step's loss
    best_val: float | None = None  # --keep-best: the kept checkpoint's validation loss
    metrics: IO[str] | None = None  # metrics.jsonl on rank 0, os.devnull on the others
    events: EventLog | None = None  # --tensorboard's event file, on rank 0
    display: Display | None = None

    def record(self, obj: dict) -> None:
        """Append one JSON line to metrics.jsonl, flushed: a crash keeps what was logged.
        A number that is not finite is written as null (JSON has no NaN)."""
        line = json.dumps({k: _json_number(v) for k, v in obj.items()}, allow_nan=False)
        try:
            self.metrics.write(line + "\n")
            self.metrics.flush()
        except OSError as e:
            path = self.folder / METRICS_FILE
            raise EulerError(
                f"could not append to {path}: {e.strerror or e}; {_kept(self)}"
            ) from None
        if self.events is not None:
            self.events.record(obj)

    def close_metrics(self) -> None:
        """Close metrics.jsonl (and the event file); a flush that fails again (a full disk)
        was already reported."""
        with contextlib.suppress(OSError):
            self.metrics.close()
            if self.events is not None:
                self.events.close()


def _json_number(value):
    """value for json.dumps: non-finite floats (alone or in a list) as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_number(v) for v in value]
    return value


def train(tc: TrainConfig, resume: bool = False, overwrite: bool = False, console=None) -> dict:
    """Run (or continue, with resume=True and tc read from the folder) a training run.

    Returns a summary: steps, final losses, tokens/s, whether it was interrupted.
    """
    from rich.console import Console

    comm = distributed.connect(tc.device)  # one rank unless under mpiexec; before the backend
    distributed.check_batch(tc.batch_size, comm.size)
    console = console or Console(soft_wrap=True, quiet=comm.rank > 0)  # rank 0 speaks
    log = lambda s: console.print(s, markup=False, highlight=False)  # noqa: E731
    # rank 0 holds the lock for every rank of the run
    with run_folder.lock_run(Path(tc.out_dir), create=not resume, owner=comm.rank == 0):
        try:
            r = _set_up(tc, comm, resume, overwrite, log)
            return _train(r, console, log)
        except BaseException:
            if not resume and comm.rank == 0:  # a failed start leaves no run behind it
                run_folder.undo_start(Path(tc.out_dir))
            raise
        finally:
            run_folder.forget_claim(Path(tc.out_dir))


def _train(r: RunState, console, log: Callable) -> dict:
    """The steps of a run that is set up, from r.start to r.total; train()'s summary."""
    tc = r.tc
    graphs = step_graph.StepGraphs(r.model.be, enabled=tc.cuda_graph, log=log)
    log(_banner(r, graphs.active))
    cached = kernels_compiled()  # else the step-0 evaluation and the first step compile
    notice = compile_notice(cached, None if cached else last_compile_seconds())
    started = time.perf_counter()
    r.display = Display(console, r.total, r.start, tc.log_every, notice)
    graphs.log = r.display.print  # above the progress bar
    train_seconds, train_tokens, loss = 0.0, 0, float("nan")
    first_seconds = None  # this process's first step: the kernels' compile or cache load included
    timed_seconds, timed_tokens = 0.0, 0  # the steps after it: what speed and ETA measure
    val = [float("nan")] * (1 + r.cfg.n_mtp)  # last evaluation: mean of heads, then per head
    interrupted = False
    try:
        with StopRequest() as stop:
            if r.start == 0:
                val = _evaluate_and_log(r, 0)
            batch = r.data.get("train", r.start * tc.grad_accum, tc.seed)
            for step in range(r.start, r.total):
                t0 = time.perf_counter()
                lr = lr_at(step, tc, r.total)
                loss, norm, batch = _optimizer_step(r, graphs, step, batch, lr)
                dt = time.perf_counter() - t0
                _write_pending(r)  # that loss and norm were of the pending checkpoint's params
                train_seconds += dt
                train_tokens += r.tokens_per_step
                if first_seconds is None:
                    first_seconds = dt
                    if not cached:
                        record_compile_seconds(time.perf_counter() - started)
                else:
                    timed_seconds += dt
                    timed_tokens += r.tokens_per_step
                done = step + 1
                tps = timed_tokens / timed_seconds if timed_seconds else None
                _log_step(r, done, loss, lr, norm, dt, tps, first_seconds)
                if done % tc.eval_every == 0 or done == r.total:
                    val = _evaluate_and_log(r, done)
                if done == r.total:
                    _save_checked(r, done, val[0])
                elif done % tc.ckpt_every == 0:
                    r.pending = _snapshot(r, done)
                # every rank asks (a collective), so all stop at the same step
                if distributed.any_rank(r.comm, stop.requested) and done < r.total:
                    _save_and_stop(r, done)
                    interrupted = True
                    break
    finally:
        graph_nodes = graphs.nodes()
        graphs.close()
        r.display.close()
        r.close_metrics()
    return _summary(r, loss, val, train_tokens, train_seconds, interrupted, graph_nodes, log,
                    first_seconds, timed_tokens, timed_seconds)  # fmt: skip


# ---------------------------------------------------------------------------- set-up


def _set_up(
    tc: TrainConfig, comm: distributed.Comm, resume: bool, overwrite: bool, log: Callable
) -> RunState:
    """Build the run: model config, backend, data, model and AdamW; then its folder (a fresh
    run claims it, a resumed run loads its checkpoint) and every rank's starting state."""
    folder = Path(tc.out_dir)
    if tc.tensorboard:  # before any work
        if Path(tc.tensorboard).resolve() == folder.resolve():
            raise EulerError(f"--tensorboard {tc.tensorboard}: is the run folder; give "
                             "event files a folder of their own (a subfolder, say)")  # fmt: skip
        check_event_dir(tc.tensorboard)
    cfg, init = _model_config(tc, folder, resume)
    # first: a missing GPU fails before any data work
    backend = make_backend(tc.device, tc.precision, tc.exact_attention)
    comm.bind(backend)
    with distributed.rank0_first(comm):  # rank 0 alone builds a missing default corpus
        data = Batches(tc, cfg, log=log)
    cfg = _fit_to_tokenizer(tc, cfg, init, data, log)
    check_bf16_sequence(tc.device, tc.precision, data.T)
    model = Model(cfg, backend, seed=tc.seed, precision=tc.precision)
    opt = AdamW(model, AdamWConfig(tc.beta1, tc.beta2, 1e-8, tc.weight_decay, tc.grad_clip))
    check_device_memory(backend, cfg, tc.batch_size, data.T, tc.precision)
    r = RunState(tc, folder, comm, cfg, data, model, opt, data.tokenizer.to_json(),
             total=tc.total_steps(data.T),
             tokens_per_step=tc.batch_size * data.T * tc.grad_accum)  # fmt: skip
    if resume:
        resume_run(r, log)
    else:
        start_fresh(r, overwrite, init)
    for buf in (model.params, opt.m, opt.v):  # every rank starts from rank 0's state
        comm.broadcast(buf)
    model.sync_lowp()  # the bf16 weight copies of what was loaded or broadcast
    metrics = folder / METRICS_FILE if comm.rank == 0 else Path(os.devnull)
    try:
        r.metrics = metrics.open("a", encoding="utf-8")
    except OSError as e:
        raise EulerError(f"could not open {metrics}: {e.strerror or e}") from None
    if tc.tensorboard and comm.rank == 0:
        try:
            r.events = EventLog(tc.tensorboard)
        except OSError as e:
            raise EulerError(f"--tensorboard {tc.tensorboard}: {e.strerror or e}") from None
    return r


def _model_config(
    tc: TrainConfig, folder: Path, resume: bool
) -> tuple[ModelConfig, checkpoint.Checkpoint | None]:
    """The model config, a preset or the architecture of the checkpoint SFT starts from;
    and that checkpoint, when a fresh SFT run takes its weights (else None)."""
    if tc.kind == "sft" and resume:  # the checkpoint it started from may be gone by now
        return run_folder.read_run(folder)[1], None
    if tc.kind == "sft":
        if not tc.init_from:
            raise EulerError(
                "sft needs --checkpoint CHECKPOINT (a pretraining run or its checkpoint)"
            )
        init = checkpoint.load(tc.init_from)
        return init.cfg, init
    return tc.model_config(), None


def _fit_to_tokenizer(
    tc: TrainConfig, cfg: ModelConfig, init: checkpoint.Checkpoint | None, data: Batches, log
) -> ModelConfig:
    """cfg with the vocabulary of the data's tokenizer, which SFT's checkpoint must share."""
    V = data.tokenizer.vocab_size
    if init is None and V != cfg.vocab_size:  # the embedding and heads follow the tokenizer
        log(
            f"vocab_size {V}, from the tokenizer of {data.folder} "
            f"(preset {tc.preset} has {cfg.vocab_size})"
        )
        cfg = dataclasses.replace(cfg, vocab_size=V)
    if init is not None and init.tokenizer_sha256 != data.tokenizer.sha256:
        raise EulerError(
            f"{data.folder} was tokenized by tokenizer {data.tokenizer.sha256[:12]}, but "
            f"{init.path} uses tokenizer {init.tokenizer_sha256[:12]}; prepare the SFT data "
            f"with `euler data prepare-sft --tokenizer {init.path}`"
        )
    return cfg


def _banner(r: RunState, graphs_active: bool) -> str:
    """The line that opens a run: what trains, where, for how many steps, on what data; on a
    GPU a second line with everything its backend does (GpuBackend.settings, in run.json)."""
    tc = r.tc
    on = f"{tc.device} (CUDA graphs)" if graphs_active else tc.device
    if tc.device == "cpu":
        on += f" ({numba.get_num_threads()} threads)"
    line = (
        f"{tc.kind} {r.cfg.n_params():,} parameters on {on}: steps {r.start}->{r.total}, "
        f"{r.tokens_per_step:,} tokens/step (B={tc.batch_size}, T={r.data.T}, "
        f"accum={tc.grad_accum}), data {r.data.folder}"
    )
    settings = getattr(r.model.be, "settings", None)  # the GPU backend's options
    if settings is None:
        return line
    return line + "\nGPU backend: " + " ".join(f"{k}={v}" for k, v in settings().items())


# ---------------------------------------------------------------------------- the step


def _optimizer_step(
    r: RunState, graphs: step_graph.StepGraphs, step: int, batch: tuple, lr: float
) -> tuple[float, float, tuple]:
    """Optimizer step `step` (0-based) at learning rate lr, over grad_accum micro-batches of
    which `batch` (tokens (B, T), targets (K, B, T)) is the first: forward and backward of
    each, the all-reduce of the gradients, the clipped AdamW update.

    Returns (the loss, the mean over ranks; the gradient norm; the first batch of step + 1).
    A loss or norm that is not finite stops the run. The update runs before the loss is
    read (on a GPU the host reads the loss only once the step's work is queued): the
    parameters it leaves in memory are never saved, since the run stops.
    """
    tc, model = r.tc, r.model
    losses = []
    for micro in range(tc.grad_accum):
        if micro:
            batch = r.data.get("train", step * tc.grad_accum + micro, tc.seed)
        tokens, targets, scale = distributed.shard_batch(*batch, r.comm)
        # each micro-batch's head weights carry 1 / grad_accum: the gradients accumulate into
        # their mean, with no pass over the buffer afterwards
        model.stage(tokens, targets, scale / tc.grad_accum)
        losses.append(step_graph.forward_backward(graphs, model, micro > 0))
        if micro + 1 < tc.grad_accum:
            # a GPU backend returns the loss lazily, in a buffer the next micro-batch reuses:
            # read it now
            losses[-1] = float(losses[-1])
    r.comm.allreduce_mean(model.grads)  # the global batch's gradient, on every rank
    norm = step_graph.update(graphs, r.opt, lr)
    if step + 1 < r.total:  # the next batch, read while the device works
        batch = r.data.get("train", (step + 1) * tc.grad_accum, tc.seed)
    # float() waits for the device
    losses = [float(x) for x in losses]
    for micro_loss in losses:
        if not math.isfinite(micro_loss):
            _stop_nonfinite("loss", micro_loss, step + 1, r)
    loss = distributed.global_mean(r.comm, sum(losses))
    norm = float(norm)
    if not math.isfinite(norm):
        _stop_nonfinite("gradient norm", norm, step + 1, r)
    model.be.synchronize()
    return loss, norm, batch


def _stop_nonfinite(what: str, value: float, step: int, r: RunState) -> typing.NoReturn:
    """Stop the run on a loss or norm that is not finite; the pending checkpoint is dropped."""
    r.pending = None
    raise EulerError(f"{what} is {value} at step {step}: training stopped; {_kept(r)}")


def _kept(r: RunState) -> str:
    """What a stopped run leaves: the step of the checkpoint on disk, if any."""
    if r.saved_step is None:
        return "no checkpoint whose loss was finite had been written"
    return (
        f"kept the newest checkpoint whose loss was finite (step {r.saved_step}) in "
        f"{r.folder / checkpoint.CHECKPOINT_NAME}"
    )


# ---------------------------------------------------------------------------- log, evaluate, save


def _log_step(
    r: RunState, step: int, loss: float, lr: float, norm: float, dt: float, tps: float | None,
    first_seconds: float | None,
) -> None:  # fmt: skip
    """Record finished step `step` (1-based) in metrics.jsonl and show it; dt: its seconds,
    tps: tokens per second over this process's steps after its first (None: none yet)."""
    r.record({"step": step, "loss": loss, "lr": lr, "grad_norm": norm,
              "tokens": step * r.tokens_per_step, "tok_s": r.tokens_per_step / dt})  # fmt: skip
    eta = (r.total - step) * r.tokens_per_step / tps if tps else None
    r.display.step(step, r.total, loss, lr, tps, eta, first_seconds)


def _evaluate_and_log(r: RunState, step: int) -> list[float]:
    """Validation loss and a text sample after step `step`, recorded and shown; returns
    [the objective (mean over heads), then each head's loss], in nats."""
    tc = r.tc
    val, heads = evaluate(r.model, r.data, tc.eval_batches)
    sample = ""
    if tc.sample_tokens:
        params = r.model.be.to_host(r.model.params)
        sample = text_sample(params, r.cfg, r.data, tc.sample_tokens, seed=tc.seed + step)
    r.record({"step": step, "val_loss": val, "val_loss_heads": heads, "sample": sample})
    if tc.keep_best:
        _keep_best(r, step, val)
    # the headline is next-token loss (head 0), the number other projects report; the
    # objective (the mean over the MTP heads) beside it, labelled
    r.display.print(f"step {step}: val loss {heads[0]:.4f} (next token; mean of the "
                    f"{len(heads)} heads {val:.4f}) | {sample!r}")  # fmt: skip
    return [val, *heads]


def _snapshot(r: RunState, step: int) -> _Snapshot:
    """The checkpoint after step `step`, copied to the host (on rank 0: the ranks hold the
    same state, one of them writes it): weights, moments and the state that resumes it."""
    tc, be = r.tc, r.model.be
    state = {
        "step": step,
        "adam_step": r.opt.step_count,
        "tokens_seen": step * r.tokens_per_step,
        "loader": {"kind": tc.kind, "seed": tc.seed, "next_batch": step * tc.grad_accum},
        "rng": {"sample_seed": [tc.seed, step], "eval_seed": EVAL_SEED},
        "run_id": r.run_id,
    }
    if r.comm.rank > 0:
        return _Snapshot(step, None, None, state)
    moments = {"m": _host_copy(be, r.opt.m), "v": _host_copy(be, r.opt.v)}
    return _Snapshot(step, _host_copy(be, r.model.params), moments, state)


def _host_copy(be: Backend, x) -> np.ndarray:
    """x on the host in memory of its own (the CPU backend's to_host is x itself, which
    the next step updates)."""
    host = be.to_host(x)
    return host.copy() if isinstance(x, np.ndarray) and np.shares_memory(host, x) else host


def _write(r: RunState, snap: _Snapshot) -> None:
    """Write a snapshot whose parameters' loss was finite as the run's checkpoint (and, at
    a --keep-every step, keep that file under its step's name too)."""
    if r.comm.rank == 0:
        latest = r.folder / checkpoint.CHECKPOINT_NAME
        checkpoint.save(latest, r.cfg, snap.params, snap.moments, snap.state, r.tc.to_dict(),
                        r.tokenizer_json)  # fmt: skip
        if r.tc.keep_every and snap.step % r.tc.keep_every == 0:
            # a second name for the same file: the next save replaces `latest` by a rename,
            # so this name keeps these bytes without a copy
            kept = r.folder / run_folder.kept_name(snap.step)
            tmp = kept.with_name(f".{kept.name}.link.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(latest, tmp)
            except OSError:  # a file system without hard links: a copy
                shutil.copyfile(latest, tmp)
            os.replace(tmp, kept)
    r.saved_step = snap.step


def _keep_best(r: RunState, step: int, val: float) -> None:
    """--keep-best: after an evaluation whose loss beats the kept one's, checkpoint the
    parameters after step `step` as checkpoint-best.safetensors (its state holds val_loss)."""
    path = r.folder / run_folder.kept_name(None)
    if r.best_val is None:  # a resumed run: the kept file's loss, if this run wrote it
        r.best_val = math.inf
        if path.is_file():
            kept = checkpoint.load(path)
            if kept.state.get("run_id") == r.run_id:
                r.best_val = float(kept.state.get("val_loss", math.inf))
    if not math.isfinite(val) or val >= r.best_val:
        return
    r.best_val = val
    snap = _snapshot(r, step)
    if r.comm.rank == 0:
        checkpoint.save(path, r.cfg, snap.params, snap.moments, {**snap.state, "val_loss": val},
                        r.tc.to_dict(), r.tokenizer_json)  # fmt: skip


def _write_pending(r: RunState) -> None:
    """The step just taken measured the pending checkpoint's parameters finite: write it."""
    if r.pending is not None:
        _write(r, r.pending)
        r.pending = None


def _save_checked(r: RunState, step: int, val_loss: float) -> None:
    """Checkpoint the parameters after step `step`, whose validation loss is val_loss:
    written if finite, else the run stops keeping the checkpoint on disk."""
    if not math.isfinite(val_loss):
        _stop_nonfinite("the validation loss", val_loss, step, r)
    _write(r, _snapshot(r, step))


def _save_and_stop(r: RunState, step: int) -> None:
    """Ctrl-C after step `step`: checkpoint it (unless just done) and say how to continue."""
    r.pending = None  # a snapshot of this step: written below once its loss is known
    if r.saved_step != step:
        _save_checked(r, step, evaluate(r.model, r.data, r.tc.eval_batches)[0])
    r.display.print(
        f"interrupted: checkpoint at step {step} in {r.folder}; continue with --resume {r.folder}"
    )


def _summary(
    r: RunState, loss: float, val: list[float], tokens: int, seconds: float, interrupted: bool,
    graph_nodes: int, log: Callable, first_seconds: float | None = None, timed_tokens: int = 0,
    timed_seconds: float = 0.0,
) -> dict:  # fmt: skip
    """train()'s result (and, for a run that finished, its closing line); tokens and seconds:
    this process's training tokens and time. tokens_per_second is measured over the steps
    after this process's first (which compiles the kernels on a cold cache, reported apart
    as first_step_seconds); a single step is its own measure."""
    tps = timed_tokens / timed_seconds if timed_seconds else tokens / seconds if seconds else 0.0
    summary = {
        "run": str(r.folder),
        "steps": r.saved_step,
        "total_steps": r.total,
        "train_loss": loss,
        "val_loss": val[0],
        "val_loss_heads": val[1:],
        "val_loss_next_token": val[1],  # head 0: the headline
        "train_tokens": tokens,
        "train_seconds": seconds,
        "tokens_per_second": tps,
        "first_step_seconds": first_seconds,  # the kernels' compile or cache load included
        "interrupted": interrupted,
        "graph_nodes": graph_nodes,  # kernels and copies in the captured CUDA graphs (0: none)
    }
    if not interrupted and r.start == r.total:
        log(f"{r.folder} is at step {r.total} of {r.total} already: nothing to train "
            "(a larger --steps continues it)")  # fmt: skip
    elif not interrupted:
        note = _speed_note(first_seconds, timed_seconds)
        log(
            f"done: step {r.saved_step}, train loss {loss:.4f} (mean of the heads), val loss "
            f"{val[1]:.4f} (next token; mean of the heads {val[0]:.4f}), {tps:,.0f} "
            f"tokens/s{note}; "
            f"checkpoint {r.folder / checkpoint.CHECKPOINT_NAME}"
        )
    return summary


def _speed_note(first_seconds: float | None, timed_seconds: float) -> str:
    """What the summary's tokens/s measured, and the first step's time apart from it."""
    if first_seconds is None:
        return ""
    if not timed_seconds:
        return f" (one step, {FIRST_STEP_EXTRA}: {first_seconds:.1f} s)"
    return f" after the first step (which took {first_seconds:.1f} s, {FIRST_STEP_EXTRA})"
