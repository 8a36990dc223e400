"""The same architecture in PyTorch (autograd): the speed peer and the gradient oracle.

Only bench/ and tests/ import this file; the `euler` package never imports torch. The model
follows the math stated in tests/numpy_reference.py (RMSNorm, rotate-halves RoPE, causal
GQA through `F.scaled_dot_product_attention`, SwiGLU, K untied multi-token-prediction
heads), and its parameters carry our names: a module path minus its ".weight" suffix is
the name in euler.model.params.param_table, so weights load from, and gradients return to, the
same dict as `ParamLayout(cfg).views(flat)`.

Run as a script to time eager training steps (forward, backward, clipping, AdamW):

    python -m euler.bench.torch_peer --preset small --batch-size 16 --seq-len 128 --threads 2
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import torch.nn.functional as F
import typer
from torch import nn

from euler.model.config import ModelConfig, get_preset
from euler.model.params import ParamLayout, init_params, param_table


class RMSNorm(nn.Module):
    """(..., D) -> (..., D): x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(B, N, T, E), (T, E/2) x2 -> (B, N, T, E): rotate halves (i, i + E/2) by angle t theta_i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """(B, T, D) -> (B, T, D): RoPE'd causal grouped-query attention, no biases."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, H, G, E = cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_size
        self.H, self.G, self.E = H, G, E
        self.wq = nn.Linear(D, H * E, bias=False)
        self.wk = nn.Linear(D, G * E, bias=False)
        self.wv = nn.Linear(D, G * E, bias=False)
        self.wo = nn.Linear(H * E, D, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.H, self.E).transpose(1, 2)  # (B, H, T, E)
        k = self.wk(x).view(B, T, self.G, self.E).transpose(1, 2)  # (B, G, T, E)
        v = self.wv(x).view(B, T, self.G, self.E).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa maps query head h to kv head h // (H / G), as repeat_interleave would
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.G != self.H)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.E))


class SwiGLU(nn.Module):
    """(B, T, D) -> (B, T, D): w_down(silu(w_gate x) * w_up x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, Fh = cfg.d_model, cfg.ffn_hidden
        self.w_gate = nn.Linear(D, Fh, bias=False)
        self.w_up = nn.Linear(D, Fh, bias=False)
        self.w_down = nn.Linear(Fh, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """(B, T, D) -> (B, T, D): x + attn(rmsnorm(x)), then x + mlp(rmsnorm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TorchPeer(nn.Module):
    """tokens (B, T), targets (K, B, T) or None -> (loss or None, logits (B, T, K, V))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # tied: head 0 is tok_emb's weight, and only heads 1..K-1 are parameters of their own
        n_own = cfg.n_mtp - 1 if cfg.tie_embeddings else cfg.n_mtp
        if n_own:
            self.mtp_heads = nn.Parameter(torch.empty(n_own, cfg.vocab_size, cfg.d_model))
        # angles in float64 whatever the model dtype; .to(dtype) later only rounds cos and sin
        E = cfg.head_size
        inv_freq = cfg.rope_base ** (-torch.arange(0, E, 2, dtype=torch.float64) / E)
        angle = torch.arange(cfg.context, dtype=torch.float64)[:, None] * inv_freq  # (T, E/2)
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        B, T = tokens.shape
        K, V, D = self.cfg.n_mtp, self.cfg.vocab_size, self.cfg.d_model
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.tok_emb(tokens)
        for block in self.layers:
            x = block(x, cos, sin)
        xf = self.final_norm(x)
        own = [self.mtp_heads] if hasattr(self, "mtp_heads") else []
        if self.cfg.tie_embeddings:
            heads = torch.cat([self.tok_emb.weight[None], *own])
        else:
            heads = self.mtp_heads
        # all K heads as one (B T, D) x (D, K V) product
        logits = (xf @ heads.reshape(K * V, D).T).view(B, T, K, V)
        if targets is None:
            return None, logits
        tgt = targets.permute(1, 2, 0)  # (B, T, K), matching the logits' order
        nll = F.cross_entropy(
            logits.reshape(-1, V), tgt.reshape(-1), ignore_index=-1, reduction="none"
        ).view(B, T, K)
        counts = (tgt >= 0).sum(dim=(0, 1))  # (K,)
        # clamp keeps 0/0 (and its NaN gradient) out of heads with no target
        head_loss = nll.sum(dim=(0, 1)) / counts.clamp(min=1)
        return head_loss[counts > 0].mean(), logits


def peer_param_names(model: TorchPeer) -> dict[str, nn.Parameter]:
    """Our parameter name -> the model's parameter (module path minus '.weight')."""
    named = {n.removesuffix(".weight"): p for n, p in model.named_parameters()}
    expected = [name for name, _, _ in param_table(model.cfg)]
    assert sorted(named) == sorted(expected), "peer and param_table disagree on names"
    return named


def build_peer(
    cfg: ModelConfig, params: Mapping[str, np.ndarray], dtype: torch.dtype = torch.float64
) -> TorchPeer:
    """A TorchPeer of `dtype` holding copies of `params` (our names, our shapes)."""
    model = TorchPeer(cfg).to(dtype)
    with torch.no_grad():
        for name, p in peer_param_names(model).items():
            src = torch.from_numpy(np.ascontiguousarray(params[name]))
            assert p.shape == src.shape, f"{name}: peer {tuple(p.shape)} vs {tuple(src.shape)}"
            p.copy_(src)
    return model


def peer_forward(
    cfg: ModelConfig,
    params: Mapping[str, np.ndarray],
    tokens: np.ndarray,
    targets: np.ndarray | None,
    dtype: torch.dtype = torch.float64,
) -> tuple[float | None, np.ndarray]:
    """(B, T), (K, B, T) or None -> (loss or None, logits (K, B, T, V)), as reference_forward."""
    model = build_peer(cfg, params, dtype)
    tgt = None if targets is None else torch.from_numpy(np.asarray(targets, dtype=np.int64))
    with torch.no_grad():
        loss, logits = model(torch.from_numpy(np.asarray(tokens, dtype=np.int64)), tgt)
    return (None if loss is None else loss.item()), logits.permute(2, 0, 1, 3).numpy()


def loss_and_grads(
    cfg: ModelConfig,
    params: Mapping[str, np.ndarray],
    tokens: np.ndarray,
    targets: np.ndarray,
    dtype: torch.dtype = torch.float64,
) -> tuple[float, dict[str, np.ndarray]]:
    """(B, T), (K, B, T) -> (loss, d loss / d param for every name in param_table)."""
    model = build_peer(cfg, params, dtype)
    loss, _ = model(
        torch.from_numpy(np.asarray(tokens, dtype=np.int64)),
        torch.from_numpy(np.asarray(targets, dtype=np.int64)),
    )
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in peer_param_names(model).items()}
    return loss.item(), grads


def flops_per_token(cfg: ModelConfig, T: int) -> int:
    """Training FLOPs per token: 6 per matrix weight, plus 6 T H E per layer for causal attention.

    Matrix weights are every linear layer and the K heads (the embedding is a lookup). The
    attention term counts q k^T and p v (2 FLOPs per multiply-add each) over the T/2 keys a
    query sees on average, times 3 for forward plus backward.
    """
    matrix = sum(
        math.prod(shape)
        for name, shape, _ in param_table(cfg)
        if len(shape) > 1 and name != "tok_emb"
    )
    tied_head = cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0  # tok_emb as head 0
    return 6 * (matrix + tied_head) + 6 * cfg.n_layer * T * cfg.q_dim


def training_step(
    cfg: ModelConfig, batch: int, seq: int, seed: int = 0, optimizer: str = "fused"
) -> Callable[[], float]:
    """An eager float32 training step on one fixed random (batch, seq) batch: forward,
    backward, clip to 1.0, AdamW; calling it runs one step and returns the loss.

    `optimizer` picks torch's AdamW implementation: "fused", "foreach" or "for-loop".
    """
    torch.manual_seed(seed)
    layout = ParamLayout(cfg)
    model = build_peer(cfg, layout.views(init_params(layout, seed)), torch.float32)
    decay = {name for name, _, d in param_table(cfg) if d}
    named = peer_param_names(model)
    groups = [
        {"params": [p for n, p in named.items() if n in decay], "weight_decay": 0.1},
        {"params": [p for n, p in named.items() if n not in decay], "weight_decay": 0.0},
    ]
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), **impl[optimizer])

    K = cfg.n_mtp
    window = torch.randint(0, cfg.vocab_size, (batch, seq + K))
    tokens = window[:, :seq]
    targets = torch.stack([window[:, 1 + k : 1 + k + seq] for k in range(K)])  # (K, B, T)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss, _ = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    return step


def time_training(
    cfg: ModelConfig,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    threads: int,
    seed: int = 0,
    optimizer: str = "fused",
) -> dict:
    """Time training_step's steps on `threads` threads; return stats.

    One fixed random batch is reused, so data loading is not part of the measurement.
    """
    torch.set_num_threads(threads)
    step = training_step(cfg, batch, seq, seed, optimizer)

    for _ in range(warmup):
        step()
    times = []
    cpu0 = time.process_time()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    total = sum(times)
    # near `threads` when the cores were ours; lower means another process took them
    cpu_per_wall = (time.process_time() - cpu0) / total
    tok_per_s = steps * batch * seq / total
    fpt = flops_per_token(cfg, seq)
    return {
        "tokens_per_s": tok_per_s,
        "tokens_per_s_median_step": batch * seq / float(np.median(times)),
        "ms_per_step_mean": 1e3 * total / steps,
        "ms_per_step_median": 1e3 * float(np.median(times)),
        "ms_per_step_min": 1e3 * min(times),
        "gflop_per_s": tok_per_s * fpt / 1e9,
        "flop_per_token": fpt,
        "flop_formula": "6 * (linear + head weights) + 6 * n_layer * T * n_head * head_size",
        "cpu_seconds_per_wall_second": cpu_per_wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(
    preset: Annotated[
        str, typer.Option(help="model preset from euler.model.config.PRESETS")
    ] = "small",
    batch: Annotated[int, typer.Option("--batch-size", help="B: sequences per step")] = 16,
    seq: Annotated[int, typer.Option("--seq-len", help="T: tokens per sequence")] = 128,
    steps: Annotated[int, typer.Option(help="timed training steps")] = 20,
    warmup: Annotated[
        int, typer.Option("--untimed-steps", help="Untimed steps first (allocator, thread pool)")
    ] = 3,
    threads: Annotated[int, typer.Option(help="torch.set_num_threads")] = 2,
    optimizer: Annotated[
        str, typer.Option(help="AdamW implementation: fused, foreach, for-loop")
    ] = "fused",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="also write the result here")
    ] = None,
) -> None:
    """Time PyTorch eager training of the same architecture; print (and save) JSON."""
    cfg = get_preset(preset)
    cfg.check_sequence(seq)
    stats = time_training(cfg, batch, seq, steps, warmup, threads, optimizer=optimizer)
    result = {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "what": "PyTorch eager training step (forward, backward, clip 1.0, AdamW), float32",
        "preset": preset,
        "config": cfg.to_dict(),
        "batch": batch,
        "seq": seq,
        "tokens_per_step": batch * seq,
        "steps": steps,
        "warmup": warmup,
        "threads": threads,
        "optimizer": f"torch.optim.AdamW ({optimizer})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        **stats,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")


if __name__ == "__main__":
    typer.run(main)
