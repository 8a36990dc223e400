"""The PyTorch peer's training step as `euler bench` times it: eager or torch.compile'd.

The peer model (euler.bench.torch_peer) imports torch at module level, so it is imported
only inside these functions: the rest of the package never imports torch. The step matches
ours: the same initial weights and batch, clipping and AdamW with euler.training.optim's
hyper-parameters (decay on the weight matrices only), torch's fused AdamW, and the same
--precision, as PyTorch users run each (set_precision):
- fp32: float32 weights and activations, exact float32 matmuls (no TF32 anywhere);
- tf32: the same with TF32 matmuls (torch.set_float32_matmul_precision("high"));
- bf16: float32 master weights, forward and loss under torch.autocast(dtype=bfloat16), the
  way llm.c's PyTorch reference (train_gpt2.py) and nanoGPT train: autocast runs the
  products and attention in bf16 and keeps what it lists as fp32 (the loss's log-softmax
  on CUDA) in float32. The CPU's autocast does the same with bf16 kernels of its own, which
  on a CPU without bf16 instructions (AVX512-BF16, AMX) are slower than its float32 ones
  (measured on this repository's 2-core EPYC: a `tiny` step 522 ms against 343 in fp32).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from euler.bench.timing import StepTurns, peak_rss_mib, reset_peak_rss, time_steps
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, init_params, param_table
from euler.training.optim import AdamWConfig

LR = 3e-4
# what each precision's peer runs, as the step tables name it
PEER_PRECISION = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16 autocast"}


def load_torch_peer():
    """(euler.bench.torch_peer, None) or (None, why it is skipped). Imports torch."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed (pip install -e .[bench])"
    from euler.bench import torch_peer

    return torch_peer, None


def set_precision(precision: str, device: str):
    """Set torch's float32 matmul precision for `precision`; return the context that the
    forward and the loss run in (bf16: autocast to bfloat16 on `device`)."""
    import contextlib

    import torch

    # tf32, and under bf16 the float32 products autocast leaves (as llm.c's reference sets
    # it): TF32 on the GPU. fp32, and every float32 product on the CPU: exact ("high"
    # could let oneDNN lower float32 products there)
    exact = precision == "fp32" or device == "cpu"
    torch.set_float32_matmul_precision("highest" if exact else "high")
    torch.backends.cuda.matmul.allow_tf32 = not exact  # "highest" implies it; stated
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def time_peer(
    peer,
    cfg: ModelConfig,
    device: str,
    tokens: np.ndarray,
    targets: np.ndarray,
    steps: int,
    warmup: int,
    threads: int,
    precision: str,
    compiled: bool,
    turns: StepTurns | None = None,
) -> dict:
    """Time the peer's step on tokens (B, T) and targets (K, B, T) in `precision` (fp32,
    tf32, bf16: set_precision); stats as time_steps (each step in its turn where turns are
    given), plus memory, or {"skipped": why} where torch.compile or CUDA is not to be had."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} sees no CUDA device"}
    torch.set_num_threads(threads)
    rss0 = reset_peak_rss() if device == "cpu" else None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    autocast = set_precision(precision, device)
    layout = ParamLayout(cfg)
    model = peer.build_peer(cfg, layout.views(init_params(layout, 0)), torch.float32).to(device)
    named = peer.peer_param_names(model)
    decay = {name for name, _, d in param_table(cfg) if d}
    hp = AdamWConfig()
    groups = [
        {"params": [p for n, p in named.items() if n in decay], "weight_decay": hp.weight_decay},
        {"params": [p for n, p in named.items() if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(hp.beta1, hp.beta2), eps=hp.eps, fused=True)
    forward = torch.compile(model) if compiled else model
    tok = torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(device)
    tgt = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with autocast:  # forward and loss only: backward follows the forward's dtypes
            loss, _ = forward(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
        opt.step()
        return loss.item()  # waits for the device, so a step's time is all its work

    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    try:
        stats = time_steps(step, sync, steps, warmup, turns)
    except Exception as e:  # torch.compile fails in many ways (no compiler, backend errors)
        if not compiled:
            raise
        return {"skipped": f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0]}"}
    stats["threads"] = threads
    stats["precision"] = PEER_PRECISION[precision]
    if device == "cpu":
        stats["peak_memory_mib"] = peak_rss_mib()
        stats["rss_at_start_mib"] = rss0
        stats["memory_kind"] = "peak RSS of the process during this engine's run"
    else:
        stats["peak_memory_mib"] = torch.cuda.max_memory_reserved() / 2**20
        stats["memory_kind"] = "torch.cuda.max_memory_reserved"
    return stats


def time_peer_in_own_process(
    cfg: ModelConfig,
    device: str,
    tokens: np.ndarray,
    targets: np.ndarray,
    steps: int,
    warmup: int,
    threads: int,
    precision: str,
    compiled: bool,
    turns: StepTurns | None = None,
) -> dict:
    """time_peer in a fresh Python process, as a user would run PyTorch alone; turns (pipe
    ends) pass to that process, and this one closes its copies.

    In our process the peer would share its cores with our sleeping thread pools and run
    under the OpenMP and BLAS settings our CPU backend makes for itself (measured: torch
    eager at 2,117 tokens/s there against about 11,600 alone on the same 2 cores).
    """
    env = dict(os.environ)
    fds = (turns.go, turns.done) if turns is not None else ()
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "tokens.npy", np.asarray(tokens), allow_pickle=False)
        np.save(Path(tmp) / "targets.npy", np.asarray(targets), allow_pickle=False)
        job = {"cfg": cfg.to_dict(), "device": device, "steps": steps, "warmup": warmup,
               "threads": threads, "precision": precision, "compiled": compiled,
               "dir": tmp, "turns": list(fds)}  # fmt: skip
        code = "import sys; from euler.bench.peer import _peer_child; _peer_child(sys.argv[1])"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(job)], env=env, pass_fds=fds,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for fd in fds:  # the peer's alone: a driver sees the pipe close if the peer dies
            os.close(fd)
        stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"peer process failed: {last}"}
    return json.loads(stdout.strip().splitlines()[-1])


def _peer_child(job_json: str) -> None:
    """Entry point of the peer's process: time it and print the stats as one JSON line."""
    job = json.loads(job_json)
    peer, why = load_torch_peer()
    if peer is None:
        print(json.dumps({"skipped": why}))
        return
    folder = Path(job["dir"])
    tokens = np.load(folder / "tokens.npy", allow_pickle=False)
    targets = np.load(folder / "targets.npy", allow_pickle=False)
    stats = time_peer(
        peer, ModelConfig.from_dict(job["cfg"]), job["device"], tokens, targets,
        job["steps"], job["warmup"], job["threads"], job["precision"], job["compiled"],
        StepTurns(*job["turns"]) if job.get("turns") else None,
    )  # fmt: skip
    stats["process"] = "its own (a fresh Python process)"
    print(json.dumps(stats))
