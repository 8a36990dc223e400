"""`euler bench`'s measurements apart from the training step: layer kernels, attention, tokenizer.

Every figure is the fastest of `reps` synchronised rounds, in ms per call, after one
untimed call (which compiles or warms caches); a round is one call on the CPU and
GPU_CALLS back-to-back calls on a GPU (the host's launch cost hides behind the kernels).
Layer cases are shared with bench/test_bench_cpu.py and bench/test_bench_gpu.py, whose
test ids are their names.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from euler.bench.timing import best_ms
from euler.model.config import ModelConfig
from euler.model.transformer import rope_tables

NAIVE_SCORES_BYTES = 256 * 2**20  # the host memory naive attention's scores may take
GPU_CALLS = 10  # calls a timed round on a GPU (best_ms): the launches queue ahead of it


def calls_for(be) -> int:
    """Calls per timed round on be: GPU_CALLS on a GPU, 1 on the CPU."""
    return GPU_CALLS if be.name == "cuda" else 1


# ------------------------------------------------------------------ layers


def layer_cases(be, cfg: ModelConfig, B: int, T: int) -> dict[str, Callable[[], None]]:
    """name -> a call of one backend layer method at (B, T) of `cfg`, on random float32 inputs.

    Shared with bench/test_bench_cpu.py, whose test ids are these names.
    """
    rng = np.random.default_rng(0)
    N = B * T
    D, F, V = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size
    H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
    r = lambda *s: be.to_device(rng.standard_normal(s, dtype=np.float32))  # noqa: E731
    x, w, y, rstd = r(N, D), r(D), r(N, D), r(N)
    dx, dw = r(N, D), r(D)
    qkv, att, lse, dqkv = r(B, T, cfg.qkv_dim), r(B, T, H * E), r(B, H, T), r(B, T, cfg.qkv_dim)
    gu, h, dgu = r(N, 2 * F), r(N, F), r(N, 2 * F)
    logits, losses = r(N, V), r(N)
    targets = be.to_device(rng.integers(0, V, N).astype(np.int32))
    head_scale = be.stage_scalars("bench_head_scale", [1.0 / N])
    tokens = be.to_device(rng.integers(0, V, N).astype(np.int32))
    wte, dwte, wqkv = r(V, D), r(V, D), r(cfg.qkv_dim, D)
    cos, sin = (be.to_device(a) for a in rope_tables(cfg, np.float32))
    # consistent rstd and lse, so that the backward kernels see real statistics
    be.rmsnorm_forward(y, rstd, x, w, 1e-5)
    be.attention_forward(att, lse, qkv, H, G, E)
    return {
        "embedding_forward": lambda: be.embedding_forward(x, tokens, wte),
        "embedding_backward": lambda: be.embedding_backward(dwte, dx, tokens, False),
        "rmsnorm_forward": lambda: be.rmsnorm_forward(y, rstd, x, w, 1e-5),
        "rmsnorm_backward": lambda: be.rmsnorm_backward(dx, dw, y, dx, x, w, rstd, False),
        "rope_forward": lambda: be.rope_forward(qkv, cos, sin, H, G, E),
        "rope_backward": lambda: be.rope_backward(dqkv, cos, sin, H, G, E),
        "attention_forward": lambda: be.attention_forward(att, lse, qkv, H, G, E),
        "attention_backward": lambda: be.attention_backward(dqkv, att, qkv, att, lse, H, G, E),
        "swiglu_forward": lambda: be.swiglu_forward(h, gu),
        "swiglu_backward": lambda: be.swiglu_backward(dgu, h, gu),
        "residual_forward": lambda: be.residual_forward(y, x, dx),
        "cross_entropy_forward_backward": lambda: be.cross_entropy_forward_backward(
            losses, logits, targets, head_scale, 0
        ),
        "matmul_qkv_forward": lambda: be.matmul(qkv.reshape(N, -1), x, wqkv, trans_b=True),
    }


def time_layers(be, cfg: ModelConfig, B: int, T: int, reps: int) -> dict[str, float]:
    """Best-of-reps ms of each layer case at (B, T)."""
    return {
        name: best_ms(fn, be.synchronize, reps, calls_for(be))
        for name, fn in layer_cases(be, cfg, B, T).items()
    }


# ------------------------------------------------------------------ attention


def naive_attention_forward(q, k, v):
    """q (B, H, T, E), k v (B, H, T, E) (kv heads repeated) -> out (B, H, T, E), probs (B, H, T, T).

    Causal softmax attention with the scores materialised: the baseline FlashAttention avoids.
    """
    T, E = q.shape[2], q.shape[3]
    s = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1 / math.sqrt(E))
    rows, cols = np.triu_indices(T, 1)  # key after query: masked
    s[..., rows, cols] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v, p


def naive_attention_backward(dout, q, k, v, p):
    """dout (B, H, T, E) and the forward's tensors -> dq, dk, dv (B, H, T, E), kv per query head."""
    E = q.shape[3]
    dp = dout @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * np.float32(1 / math.sqrt(E))
    return ds @ k, ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ dout


def attention_batch(cfg: ModelConfig, B: int, T: int) -> int:
    """B, lowered so that the naive scores (B, H, T, T) float32 stay within 256 MiB."""
    return max(1, min(B, NAIVE_SCORES_BYTES // (4 * cfg.n_head * T * T)))


def _naive_numpy(qkv_h, dout_h, H: int, G: int, E: int, reps: int):
    """(forward ms, backward ms, out (B, T, H E), score bytes) of NumPy's naive attention."""
    B, T, _ = qkv_h.shape
    # operands (B, heads, T, E), kv heads repeated to match query heads (untimed)
    heads = lambda a, n: a.reshape(B, T, n, E).transpose(0, 2, 1, 3).copy()  # noqa: E731
    q = heads(qkv_h[:, :, : H * E], H)
    k = np.repeat(heads(qkv_h[:, :, H * E : (H + G) * E], G), H // G, axis=1)
    v = np.repeat(heads(qkv_h[:, :, (H + G) * E :], G), H // G, axis=1)
    do = heads(dout_h, H)
    res = {}
    fwd = best_ms(lambda: res.update(fwd=naive_attention_forward(q, k, v)), lambda: None, reps)
    o, p = res["fwd"]
    bwd = best_ms(lambda: naive_attention_backward(do, q, k, v, p), lambda: None, reps)
    return fwd, bwd, o.transpose(0, 2, 1, 3).reshape(B, T, H * E), p.nbytes


def compare_attention(
    be, cfg: ModelConfig, B: int, T: int, reps: int, on_gpu: bool = False
) -> dict:
    """Our attention (forward, backward) against naive attention at length T: NumPy's on the
    CPU, cuBLAS GEMMs over materialised scores on the GPU (on_gpu). Ours is the backend's:
    FlashAttention, or on the CPU up to T = 256 dense score blocks."""
    H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
    rng = np.random.default_rng(T)
    qkv_h = rng.standard_normal((B, T, cfg.qkv_dim), dtype=np.float32)
    dout_h = rng.standard_normal((B, T, H * E), dtype=np.float32)
    qkv, dout = be.to_device(qkv_h), be.to_device(dout_h)
    out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
    dqkv = be.zeros(qkv_h.shape, np.float32)
    n = calls_for(be)
    flash_f = best_ms(lambda: be.attention_forward(out, lse, qkv, H, G, E), be.synchronize, reps, n)
    flash_b = best_ms(
        lambda: be.attention_backward(dqkv, dout, qkv, out, lse, H, G, E), be.synchronize, reps, n
    )
    if on_gpu:
        from euler.gpu.naive_attention import NaiveAttention

        naive = NaiveAttention(be, qkv_h, dout_h, H, G, E)
        naive_f = best_ms(naive.forward, be.synchronize, reps, n)
        naive_b = best_ms(naive.backward, be.synchronize, reps, n)
        naive_out, scores_bytes = naive.out(), naive.scores_bytes()
    else:
        naive_f, naive_b, naive_out, scores_bytes = _naive_numpy(qkv_h, dout_h, H, G, E, reps)
    flash_out = be.to_host(out)
    return {
        "B": B,
        "T": T,
        "H": H,
        "G": G,
        "E": E,
        "flash_fwd_ms": flash_f,
        "flash_bwd_ms": flash_b,
        "naive_fwd_ms": naive_f,
        "naive_bwd_ms": naive_b,
        "naive_over_flash": (naive_f + naive_b) / (flash_f + flash_b),
        "naive_scores_mib": scores_bytes / 2**20,
        "max_abs_diff_out": float(np.abs(flash_out - naive_out).max()),
    }


# ------------------------------------------------------------------ tokenizer


def tokenizer_speed(vocab_size: int = 512, reps: int = 3) -> dict:
    """Train a tokenizer on the embedded corpus's help pages, then time encoding them (MB/s)."""
    from euler.data.default_corpus import pydoc_topics
    from euler.tokenizer import Tokenizer

    text = "\n\n".join(pydoc_topics())
    if not text:
        return {"skipped": "this Python build lacks pydoc_data.topics"}
    mb = len(text.encode()) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pydoc_topics.txt"
        path.write_text(text, encoding="utf-8")
        t0 = time.perf_counter()
        tok = Tokenizer.train([path], vocab_size)
        train_s = time.perf_counter() - t0
    out = {"text": "pydoc_data.topics", "mb": mb, "vocab_size": vocab_size, "train_s": train_s}
    for threads in sorted({1, os.cpu_count() or 1}):
        ms = best_ms(lambda t=threads: tok.encode_batch([text], threads=t), lambda: None, reps)
        out[f"encode_mb_per_s_{threads}_threads"] = mb / ms * 1e3
    out["bytes_per_token"] = len(text.encode()) / len(tok.encode(text))
    return out
