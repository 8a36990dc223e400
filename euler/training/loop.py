"""Pretraining and SFT: one config dataclass and one training loop, read top to bottom.

A run lives in one folder:
  run.json                 the TrainConfig and the model config the run was started with
  checkpoint.safetensors   weights, AdamW moments, step, loader/RNG state, tokenizer (atomic)
  tokenizer.json           a copy of the tokenizer, for the user's convenience
  metrics.jsonl            one JSON object per step (loss, lr, grad norm, tokens/s) and per
                           evaluation (val_loss, a short text sample)

Determinism, which makes resume exact: the batch of step s, micro-batch a is drawn from
(seed, s * grad_accum + a) alone, the learning rate is a function of s, the evaluation
batches are fixed, and the text sample at step s draws from (seed, s). So the state to save
is just the parameters, the moments, the AdamW step count and s; a run resumed from step s
repeats, bit for bit, the losses of the run that was never interrupted.

Ctrl-C finishes the current step, saves a checkpoint and stops (a second Ctrl-C stops at
once, keeping the last checkpoint). A loss or gradient norm that is not finite stops the
run without saving, so the last good checkpoint stays on disk.

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

import dataclasses
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from euler.backend import Backend
from euler.errors import EulerError
from euler.model.config import ModelConfig, get_preset
from euler.model.transformer import Model, arena_bytes, make_targets
from euler.training import checkpoint, distributed, step_graph
from euler.training.optim import AdamW, AdamWConfig

TRAIN_CONFIG_VERSION = 1
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_FILE = "tokenizer.json"
RUN_FILES = (RUN_FILE, checkpoint.CHECKPOINT_NAME, METRICS_FILE, TOKENIZER_FILE)
MEMORY_SLACK = 512 * 2**20  # cuBLAS workspace, kernel scratch, allocator rounding
EVAL_SEED = 1_000_003  # evaluation batches are the same at every evaluation, in every run
SFT_SAMPLE_INSTRUCTION = "Give three tips for staying healthy."


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs besides the model config; saved in run.json and checkpoints."""

    out_dir: str = "runs/pretrain"  # the run folder
    kind: str = "pretrain"  # "pretrain" (token shards) or "sft" (instruction records)
    preset: str = "small"  # model preset (sft: taken from the --from checkpoint instead)
    data: str | None = None  # prepared data folder; pretrain: None = the embedded corpus
    init_from: str | None = None  # sft: checkpoint whose weights the run starts from
    device: str = "cpu"  # "cpu" or "cuda"
    tf32: bool = True  # cuda: TF32 tensor cores for matrix products; False = exact fp32
    exact_attention: bool = False  # cuda with TF32: attention in exact fp32, not tensor cores
    cuda_graph: bool = True  # cuda: replay each step's device work as CUDA graphs
    batch_size: int = 8  # B: sequences per micro-batch
    seq_len: int = 0  # T: tokens per sequence; 0 = the model's context
    grad_accum: int = 1  # micro-batches per optimizer step
    steps: int = 1000  # optimizer steps (ignored when `tokens` is set)
    tokens: int = 0  # token budget: steps = ceil(tokens / tokens per step); 0 = use `steps`
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # floor of the cosine decay
    warmup_steps: int = 50  # linear warmup from lr/warmup to lr
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # global L2 norm; 0 disables clipping
    beta1: float = 0.9
    beta2: float = 0.95
    eval_every: int = 100  # steps between validation losses (and text samples)
    eval_batches: int = 8  # validation micro-batches per evaluation
    sample_tokens: int = 40  # tokens of the text sample at each evaluation; 0 = none
    ckpt_every: int = 100  # steps between checkpoints (also written at the end and on Ctrl-C)
    log_every: int = 10  # steps between log lines when the output is not a terminal
    seed: int = 0
    version: int = TRAIN_CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.kind not in ("pretrain", "sft"):
            raise EulerError(f"kind must be 'pretrain' or 'sft', got {self.kind!r}")
        if self.device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.kind == "sft" and not self.data:
            raise EulerError("sft needs --data: a folder prepared by `euler data prepare-sft`")
        for name in ("batch_size", "grad_accum", "eval_every", "eval_batches", "ckpt_every"):
            if getattr(self, name) < 1:
                raise EulerError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("seq_len", "steps", "tokens", "warmup_steps", "sample_tokens"):
            if getattr(self, name) < 0:
                raise EulerError(f"--{name.replace('_', '-')} must not be negative")
        if self.steps == 0 and self.tokens == 0:
            raise EulerError("give --steps or --tokens")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise EulerError(
                f"need 0 < --lr and 0 <= --min-lr <= --lr, got {self.lr}, {self.min_lr}"
            )
        if self.version != TRAIN_CONFIG_VERSION:
            raise EulerError(f"train config version {self.version}, need {TRAIN_CONFIG_VERSION}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "train config") -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise EulerError(f"{source}: unknown field {unknown[0]!r}")
        return cls(**d)

    def total_steps(self, T: int) -> int:
        """Optimizer steps of the run: `steps`, or enough steps to see `tokens` tokens."""
        if self.tokens:
            return math.ceil(self.tokens / (self.batch_size * T * self.grad_accum))
        return self.steps


def lr_at(step: int, tc: TrainConfig, total: int) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, total - tc.warmup_steps)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))


# ---------------------------------------------------------------------------- data


class Batches:
    """Training and validation batches of one run: (tokens (B, T) int32, targets (K, B, T)).

    The tokenizer comes from the data folder (for the embedded corpus, one of cfg.vocab_size
    tokens is trained); the model's vocabulary is sized to it.
    """

    def __init__(self, tc: TrainConfig, cfg: ModelConfig, log=print):
        from euler.data import SFTDataset, TokenLoader, default_corpus_dir
        from euler.data.manifest import read_manifest
        from euler.tokenizer import Tokenizer

        self.tc, self.K = tc, cfg.n_mtp
        self.T = tc.seq_len or cfg.context
        cfg.check_sequence(self.T)
        if tc.kind == "pretrain":
            folder = Path(tc.data) if tc.data else default_corpus_dir(cfg.vocab_size, log=log)
        else:
            folder = Path(tc.data)
        if not folder.is_dir():
            raise EulerError(f"data folder not found: {folder}")
        manifest = read_manifest(folder, kind=tc.kind)
        self.tokenizer = Tokenizer.load(folder / manifest["tokenizer"]["file"])
        self.folder = folder
        V = self.tokenizer.vocab_size
        if tc.kind == "pretrain":
            self.train = TokenLoader(folder, "train", vocab_size=V)
            self.val = TokenLoader(folder, "val", vocab_size=V)
        else:
            self.train = SFTDataset(folder, "train", vocab_size=V)
            self.val = SFTDataset(folder, "val", vocab_size=V)
            if len(self.val) == 0:
                raise EulerError(f"{folder}: no held-out records (prepare with --val-fraction > 0)")

    def get(self, split: str, index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch `index` of a split, drawn from (seed, index) alone."""
        src = self.train if split == "train" else self.val
        B, T, K = self.tc.batch_size, self.T, self.K
        if self.tc.kind == "pretrain":
            window, mask = src.batch(index, seed, B, T, K), None
        else:  # SFT: the loss counts response tokens only
            window, mask = src.batch(index, seed, B, T, K)
        return window[:, :T], make_targets(window, T, K, mask)

    def sample_prompt(self) -> np.ndarray:
        """The prompt of the text sample shown at each evaluation."""
        from euler.data import encode_prompt

        if self.tc.kind == "sft":
            return encode_prompt(self.tokenizer, SFT_SAMPLE_INSTRUCTION)
        return np.concatenate([[self.tokenizer.eot_id], self.tokenizer.encode("The")])


# ---------------------------------------------------------------------------- run folder


def check_device_memory(backend: Backend, cfg: ModelConfig, B: int, T: int) -> None:
    """Refuse, before the first step, a micro-batch whose activations do not fit on the device.

    Runs after the parameters and optimizer state are allocated, so the free memory the
    backend reports is what the activations can have (a CPU backend reports none: no check).
    """
    free = backend.free_memory()
    if free is None:
        return
    need = arena_bytes(cfg, np.float32, B, T) + MEMORY_SLACK
    if need > free:
        raise EulerError(
            f"--batch-size {B} x --seq-len {T} needs {need / 2**20:.1f} MiB of device memory "
            f"for activations and scratch, {free / 2**20:.1f} MiB is free: lower --batch-size "
            "(--grad-accum keeps the tokens per step) or --seq-len"
        )


def make_backend(device: str, tf32: bool = True, exact_attention: bool = False) -> Backend:
    """The CpuBackend or GpuBackend for --device (cpu or cuda); one-line error without a GPU."""
    if device == "cpu":
        from euler.cpu.backend import CpuBackend

        return CpuBackend()
    try:
        from euler.gpu.backend import GpuBackend
    except ImportError as e:
        raise EulerError(f"--device cuda: the GPU backend cannot be imported ({e})") from None
    return GpuBackend(tf32=tf32, tc_attention=not exact_attention)


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


def _trim_metrics(path: Path, last_step: int) -> None:
    """Drop metrics past the checkpoint's step: a resumed run logs those steps again."""
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


# ---------------------------------------------------------------------------- display


class Display:
    """A rich progress bar on a terminal; plain log lines every log_every steps otherwise."""

    def __init__(self, console, total: int, start: int, log_every: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.console, self.log_every = console, log_every
        self.progress = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}"),
                TextColumn("{task.fields[tps]:,.0f} tok/s"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            )
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               loss=float("nan"), lr=0.0, tps=0.0)  # fmt: skip
            self.progress.start()

    def step(self, step: int, total: int, loss: float, lr: float, tps: float, eta: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=loss, lr=lr, tps=tps)
        elif step % self.log_every == 0 or step == total:
            self.console.print(
                f"step {step}/{total}  loss {loss:.4f}  lr {lr:.2e}  {tps:,.0f} tok/s  "
                f"ETA {eta / 60:.1f} min"
            )

    def print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


# ---------------------------------------------------------------------------- training


def evaluate(model: Model, data: Batches, n_batches: int) -> tuple[float, list[float]]:
    """Validation loss over the fixed evaluation batches: (the training objective, the mean
    over the heads that have targets; per head k, its mean cross-entropy in nats).

    Head 0's loss is the language-model loss proper (next token); head k > 0 predicts the
    token k + 1 places ahead, a harder task, so the mean lies above head 0's.
    """
    K = model.cfg.n_mtp
    losses, head_sum, head_count = [], np.zeros(K), np.zeros(K)
    for i in range(n_batches):
        tokens, targets = data.get("val", i, EVAL_SEED)
        losses.append(float(model.forward(tokens, targets, need_grad=False)))
        per_row = model.be.to_host(model.acts.losses).astype(np.float64)  # (K, B T)
        head_sum += per_row.sum(axis=1)
        head_count += (targets >= 0).reshape(K, -1).sum(axis=1)
    heads = [float(s / c) if c else float("nan") for s, c in zip(head_sum, head_count, strict=True)]
    return float(np.mean(losses)), heads


def text_sample(params: np.ndarray, cfg: ModelConfig, data: Batches, n: int, seed: int) -> str:
    """A short continuation of the sample prompt (temperature 0.8, top-k 40), as text."""
    from euler.inference.generate import Decoder, generate
    from euler.inference.sampling import SamplingConfig

    prompt = data.sample_prompt()
    prompt = prompt[-(cfg.context // 2) :]  # leave room for the sample in a short context
    n = min(n, cfg.context - len(prompt))
    dec = Decoder(cfg, params)
    res = generate(dec, prompt, n, SamplingConfig(0.8, 40, 1.0), np.random.default_rng(seed),
                   stop_ids=(data.tokenizer.end_id, data.tokenizer.eot_id))  # fmt: skip
    return data.tokenizer.decode(prompt[1:] if prompt[0] == data.tokenizer.eot_id else prompt) + (
        data.tokenizer.decode(res.tokens)
    )


class _StopRequest:
    """SIGINT handler for the loop: the first Ctrl-C asks to stop after the current step."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C: stop now, the last checkpoint stays
                raise KeyboardInterrupt
            self.requested = True

        try:
            self._old = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: Ctrl-C cannot reach us anyway
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def train(tc: TrainConfig, resume: bool = False, overwrite: bool = False, console=None) -> dict:
    """Run (or continue, with resume=True and tc read from the folder) a training run.

    Returns a summary: steps, final losses, tokens/s, whether it was interrupted.
    """
    from rich.console import Console

    comm = distributed.connect(tc.device)  # one rank unless under mpiexec; before the backend
    distributed.check_batch(tc.batch_size, comm.size)
    console = console or Console(soft_wrap=True, quiet=comm.rank > 0)  # rank 0 speaks
    run = Path(tc.out_dir)
    log = lambda s: console.print(s, markup=False, highlight=False)  # noqa: E731

    # -- the model config: a preset, or the architecture of the checkpoint SFT starts from
    init = None
    if tc.kind == "sft" and resume:  # the checkpoint it started from may be gone by now
        cfg = read_run(run)[1]
    elif tc.kind == "sft":
        if not tc.init_from:
            raise EulerError("sft needs --from CHECKPOINT (a pretraining run or its checkpoint)")
        init = checkpoint.load(tc.init_from)
        cfg = init.cfg
    else:
        cfg = get_preset(tc.preset)
    # first: a missing GPU fails before any data work
    backend = make_backend(tc.device, tc.tf32, tc.exact_attention)
    comm.bind(backend)
    with distributed.rank0_first(comm):  # rank 0 alone builds a missing default corpus
        data = Batches(tc, cfg, log=log)
    T, V = data.T, data.tokenizer.vocab_size
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
            "with --tokenizer <the pretraining run folder>/tokenizer.json"
        )
    tokenizer_json = data.tokenizer.to_json()

    # -- the run folder: a fresh run claims it; a resumed run reads its checkpoint
    model = Model(cfg, backend, seed=tc.seed)
    opt = AdamW(model, AdamWConfig(tc.beta1, tc.beta2, 1e-8, tc.weight_decay, tc.grad_clip))
    check_device_memory(backend, cfg, tc.batch_size, T)
    start, saved_step = 0, None  # saved_step: the step of the checkpoint on disk
    if resume and (run / checkpoint.CHECKPOINT_NAME).exists():
        ck = checkpoint.load(run)
        checkpoint.check_compatible(ck, cfg, f"run {run}")
        if ck.moments is None:
            raise EulerError(f"{ck.path} holds weights only; it cannot resume training")
        if ck.tokenizer_sha256 != data.tokenizer.sha256:
            raise EulerError(f"{ck.path} was trained with another tokenizer than {data.folder}'s")
        model.be.copy_(model.params, ck.params)
        model.be.copy_(opt.m, ck.moments["m"])
        model.be.copy_(opt.v, ck.moments["v"])
        opt.step_count = int(ck.state["adam_step"])
        start = saved_step = ck.step
        if comm.rank == 0:
            _trim_metrics(run / METRICS_FILE, start)
        log(f"resuming {run} at step {start}")
    elif resume:
        log(f"{run} has no checkpoint yet: starting it from step 0")
        if comm.rank == 0:
            _trim_metrics(run / METRICS_FILE, -1)
    else:
        if comm.rank == 0:  # the other ranks never write to the run folder
            claim_run_dir(run, overwrite)
            (run / RUN_FILE).write_text(
                json.dumps({"train": tc.to_dict(), "model": cfg.to_dict()}, indent=2) + "\n"
            )
            (run / TOKENIZER_FILE).write_text(tokenizer_json, encoding="ascii")
        if init is not None:
            model.be.copy_(model.params, init.params.astype(model.dtype))
    for buf in (model.params, opt.m, opt.v):  # every rank starts from rank 0's state
        comm.broadcast(buf)

    total = tc.total_steps(T)
    tokens_per_step = tc.batch_size * T * tc.grad_accum
    metrics = (run / METRICS_FILE).open("a") if comm.rank == 0 else open(os.devnull, "w")

    def save(step: int) -> None:
        nonlocal saved_step
        state = {
            "step": step,
            "adam_step": opt.step_count,
            "tokens_seen": step * tokens_per_step,
            "loader": {"kind": tc.kind, "seed": tc.seed, "next_batch": step * tc.grad_accum},
            "rng": {"sample_seed": [tc.seed, step], "eval_seed": EVAL_SEED},
        }
        be = model.be
        if comm.rank == 0:  # the ranks hold the same state: one of them writes it
            moments = {"m": be.to_host(opt.m), "v": be.to_host(opt.v)}
            checkpoint.save(run / checkpoint.CHECKPOINT_NAME, cfg, be.to_host(model.params),
                            moments, state, tc.to_dict(), tokenizer_json)  # fmt: skip
        saved_step = step

    def record(obj: dict) -> None:
        metrics.write(json.dumps(obj) + "\n")
        metrics.flush()

    def run_eval(step: int) -> list[float]:
        val, heads = evaluate(model, data, tc.eval_batches)
        sample = ""
        if tc.sample_tokens:
            params = model.be.to_host(model.params)
            sample = text_sample(params, cfg, data, tc.sample_tokens, seed=tc.seed + step)
        record({"step": step, "val_loss": val, "val_loss_heads": heads, "sample": sample})
        display.print(f"step {step}: val loss {val:.4f} (head 0: {heads[0]:.4f}) | {sample!r}")
        return [val, *heads]

    graphs = step_graph.StepGraphs(backend, enabled=tc.cuda_graph, log=log)
    on = f"{tc.device} (CUDA graphs)" if graphs.active else tc.device
    log(
        f"{tc.kind} {cfg.n_params():,} parameters on {on}: steps {start}->{total}, "
        f"{tokens_per_step:,} tokens/step (B={tc.batch_size}, T={T}, accum={tc.grad_accum}), "
        f"data {data.folder}"
    )
    display = Display(console, total, start, tc.log_every)
    graphs.log = display.print  # above the progress bar
    train_seconds, train_tokens, loss = 0.0, 0, float("nan")
    val = [float("nan")] * (1 + cfg.n_mtp)  # last evaluation: mean of heads, then per head
    interrupted = False
    try:
        with _StopRequest() as stop:
            if start == 0:
                val = run_eval(0)
            batch = data.get("train", start * tc.grad_accum, tc.seed)
            for step in range(start, total):
                # one optimizer step over grad_accum micro-batches
                t0 = time.perf_counter()
                lr = lr_at(step, tc, total)
                losses = []
                for micro in range(tc.grad_accum):
                    if micro:
                        batch = data.get("train", step * tc.grad_accum + micro, tc.seed)
                    tokens, targets, scale = distributed.shard_batch(*batch, comm)
                    # each micro-batch's head weights carry 1 / grad_accum: the gradients
                    # accumulate into their mean, with no pass over the buffer afterwards
                    model.stage(tokens, targets, scale / tc.grad_accum)
                    losses.append(step_graph.forward_backward(graphs, model, micro > 0))
                    if micro + 1 < tc.grad_accum:
                        # a GPU backend returns the loss lazily, in a buffer the next
                        # micro-batch reuses: read it now
                        losses[-1] = float(losses[-1])
                comm.allreduce_mean(model.grads)  # the global batch's gradient, on every rank
                norm = step_graph.update(graphs, opt, lr)
                if step + 1 < total:  # the next batch, read while the device works
                    batch = data.get("train", (step + 1) * tc.grad_accum, tc.seed)
                # float() waits for the device. A non-finite loss stops the run before
                # anything is saved: the update already applied in memory is dropped
                losses = [float(x) for x in losses]
                for micro_loss in losses:
                    if not math.isfinite(micro_loss):
                        _stop_nonfinite("loss", micro_loss, step + 1, saved_step, run)
                loss = distributed.global_mean(comm, sum(losses))
                norm = float(norm)
                if not math.isfinite(norm):
                    _stop_nonfinite("gradient norm", norm, step + 1, saved_step, run)
                model.be.synchronize()
                dt = time.perf_counter() - t0
                train_seconds += dt
                train_tokens += tokens_per_step
                done = step + 1
                tps = train_tokens / train_seconds
                record({"step": done, "loss": loss, "lr": lr, "grad_norm": norm,
                        "tokens": done * tokens_per_step,
                        "tok_s": tokens_per_step / dt})  # fmt: skip
                eta = (total - done) * tokens_per_step / tps
                display.step(done, total, loss, lr, tps, eta)

                if done % tc.eval_every == 0 or done == total:
                    val = run_eval(done)
                if done % tc.ckpt_every == 0 or done == total:
                    save(done)
                stopping = distributed.any_rank(comm, stop.requested)  # all stop at one step
                if stopping and done < total:
                    if saved_step != done:
                        save(done)
                    interrupted = True
                    display.print(
                        f"interrupted: checkpoint at step {done} in {run}; "
                        f"continue with --resume {run}"
                    )
                    break
    finally:
        graph_nodes = graphs.nodes()
        graphs.close()
        display.close()
        metrics.close()
    summary = {
        "run": str(run),
        "steps": saved_step,
        "total_steps": total,
        "train_loss": loss,
        "val_loss": val[0],
        "val_loss_heads": val[1:],
        "train_tokens": train_tokens,
        "train_seconds": train_seconds,
        "tokens_per_second": train_tokens / train_seconds if train_seconds else 0.0,
        "interrupted": interrupted,
        "graph_nodes": graph_nodes,  # kernels and copies in the captured CUDA graphs (0: none)
    }
    if not interrupted:
        log(
            f"done: step {saved_step}, train loss {loss:.4f}, val loss {val[0]:.4f} "
            f"(head 0: {val[1]:.4f}), "
            f"{summary['tokens_per_second']:,.0f} tokens/s; checkpoint "
            f"{run / checkpoint.CHECKPOINT_NAME}"
        )
    return summary


def _stop_nonfinite(what: str, value: float, step: int, saved: int | None, run: Path) -> None:
    kept = (
        f"the last good checkpoint (step {saved}) is kept in {run / checkpoint.CHECKPOINT_NAME}"
        if saved is not None
        else "no checkpoint had been written yet"
    )
    raise EulerError(f"{what} is {value} at step {step}: training stopped; {kept}")
