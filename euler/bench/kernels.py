"""`euler bench`'s measurements apart from the training step: layer kernels, attention, tokenizer.

Every figure is the fastest of `reps` synchronised rounds, in ms per call, after one
untimed call (which compiles or warms caches); a round is one call on the CPU and, on a
GPU, GPU_CALLS calls queued behind a spinning kernel and timed by CUDA events, so that the
host's launches (40-90 us a call from Python) are not counted (call_ms).
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

from euler.backend import Product
from euler.bench.peer import LR
from euler.bench.timing import best_ms
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout
from euler.model.transformer import rope_tables
from euler.precision import BF16, as_float32, storage_dtype, to_bf16
from euler.training.optim import AdamWConfig

NAIVE_SCORES_BYTES = 256 * 2**20  # the host memory naive attention's scores may take
GPU_CALLS = 10  # calls a timed round on a GPU (call_ms), queued behind a spinning kernel


def call_ms(be, fn: Callable[[], None], reps: int) -> float:
    """Best-of-reps ms of one fn() on be: on a GPU device time, each round's GPU_CALLS calls
    queued behind a spinning kernel (euler.bench.device_time: the host's launches, 40-90 us
    a call from Python, are not counted); on the CPU best_ms of one call a round."""
    if be.name == "cuda":
        from euler.bench.device_time import best_device_ms

        return best_device_ms(be.stream, fn, reps, GPU_CALLS)
    return best_ms(fn, be.synchronize, reps, 1)


# ------------------------------------------------------------------ layers


def stored(precision: str, name: str, x: np.ndarray) -> np.ndarray:
    """Host float32 x as the model stores tensor `name` under precision: bf16 bits where
    euler.precision.BF16_TENSORS names it and precision is bf16, else x itself. Names are
    the model's Activations buffers, "params_lp" (the products' weights), and "params" or
    "grads" (the float32 masters and their gradients)."""
    return to_bf16(x) if storage_dtype(precision, name) == BF16 else x


def random_tensor(be, rng, precision: str, name: str, *shape: int):
    """A device array of N(0, 1) values of `shape`, stored as the model stores `name`."""
    return be.to_device(stored(precision, name, rng.standard_normal(shape, dtype=np.float32)))


def layer_cases(
    be, cfg: ModelConfig, B: int, T: int, precision: str = "fp32"
) -> dict[str, Callable[[], None]]:
    """name -> a call of one backend layer method at (B, T) of `cfg` on random inputs, each
    argument in the dtype the model passes it under `precision` (random_tensor), aliased
    where the model aliases it (rmsnorm_backward's dx and dres, rope in place).

    Shared with bench/test_bench_cpu.py and bench/test_bench_gpu.py, whose test ids are these
    names. A name ends in _forward or _backward, or is a fused step of its own.
    """
    rng = np.random.default_rng(0)
    r = lambda name, *shape: random_tensor(be, rng, precision, name, *shape)  # noqa: E731
    N = B * T
    D, F, V, QKV = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.qkv_dim
    H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
    layout = ParamLayout(cfg)
    x, xmid, xn, rstd = r("x", N, D), r("xmid", N, D), r("xn1", N, D), r("rstd1", N)
    w, dw, dx, dxn = r("params", D), r("grads", D), r("dx", N, D), r("dxn", N, D)
    qkv, att, lse = r("qkv", B, T, QKV), r("att", B, T, H * E), r("lse", B, H, T)
    dqkv, datt = r("dqkv", B, T, QKV), r("datt", B, T, H * E)
    # bf16: RoPE's backward writes the products' bf16 copy of dqkv, as Model.backward does
    dqkv_lp = r("dqkv_lp", B, T, QKV) if precision == "bf16" else None
    gu, h, dgu, dh = r("gu", N, 2 * F), r("h", N, F), r("dgu", N, 2 * F), r("dh", N, F)
    logits, losses = r("logits", N, V), r("losses", N)
    targets = be.to_device(rng.integers(0, V, N).astype(np.int32))
    head_scale = be.stage_scalars("bench_head_scale", [1.0 / N])
    tokens = be.to_device(rng.integers(0, V, N).astype(np.int32))
    wte, dwte = r("params", V, D), r("grads", V, D)
    wqkv, dwqkv = r("params_lp", QKV, D), r("grads", QKV, D)
    params, grads = r("params", layout.size), r("grads", layout.size)
    m, v = be.zeros((layout.size,), np.float32), be.zeros((layout.size,), np.float32)
    lowp = r("params_lp", layout.size) if precision == "bf16" else None
    hyper = be.stage_scalars("bench_adamw", [LR, 1 - AdamWConfig.beta1, 1 - AdamWConfig.beta2])
    cos, sin = (be.to_device(a) for a in rope_tables(cfg, np.float32))
    # consistent rstd and lse, so that the backward kernels see real statistics
    be.rmsnorm_forward(xn, rstd, x, w, 1e-5)
    be.attention_forward(att, lse, qkv, H, G, E)
    return {
        "embedding_forward": lambda: be.embedding_forward(x, tokens, wte),
        "embedding_backward": lambda: be.embedding_backward(dwte, dx, tokens, accumulate=False),
        "rmsnorm_forward": lambda: be.rmsnorm_forward(xn, rstd, x, w, 1e-5),
        "rmsnorm_backward": lambda: be.rmsnorm_backward(
            dx, dw, dxn, dx, x, w, rstd, accumulate=False
        ),
        "rope_forward": lambda: be.rope_forward(qkv, cos, sin, H, G, E),
        "rope_backward": lambda: be.rope_backward(dqkv, cos, sin, H, G, E, out=dqkv_lp),
        "attention_forward": lambda: be.attention_forward(att, lse, qkv, H, G, E),
        "attention_backward": lambda: be.attention_backward(dqkv, datt, qkv, att, lse, H, G, E),
        "swiglu_forward": lambda: be.swiglu_forward(h, gu),
        "swiglu_backward": lambda: be.swiglu_backward(dgu, dh, gu),
        "residual_forward": lambda: be.residual_forward(xmid, x, xmid),
        "cross_entropy_forward_backward": lambda: be.cross_entropy_forward_backward(
            losses, logits, targets, head_scale, 0
        ),
        # the products: bf16 operands under bf16; outputs bf16 (qkv) or float32 (dX, dW)
        "matmul_qkv_forward": lambda: be.matmul(qkv.reshape(N, -1), xn, wqkv, trans_b=True),
        "matmul_qkv_backward": lambda: _linear_backward(
            be, dxn, dwqkv, (dqkv if dqkv_lp is None else dqkv_lp).reshape(N, -1), xn, wqkv
        ),
        "adamw_step": lambda: be.adamw_step(
            params, grads, m, v, AdamWConfig(), hyper, layout.n_decay, lowp
        ),
    }


def _linear_backward(be, dx, dw, dy, x, w) -> None:
    """dx (N, D) = dy (N, M) w (M, D) and dw (M, D) = dy^T x (N, D): a linear layer's two
    backward products, as Model.backward's matmul_pair issues them, then waited for."""
    be.matmul_pair(Product(dx, dy, w), Product(dw, dy, x, trans_a=True))
    be.wait_deferred()


def time_layers(
    be, cfg: ModelConfig, B: int, T: int, reps: int, precision: str = "fp32"
) -> dict[str, float]:
    """Best-of-reps ms of each layer case at (B, T) in `precision` (call_ms: device time on
    a GPU)."""
    return {
        name: call_ms(be, fn, reps) for name, fn in layer_cases(be, cfg, B, T, precision).items()
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
    be, cfg: ModelConfig, B: int, T: int, reps: int, on_gpu: bool = False,
    precision: str = "fp32",
) -> dict:  # fmt: skip
    """Our attention (forward, backward) against naive attention at length T: NumPy's on the
    CPU, cuBLAS GEMMs over materialised scores on the GPU (on_gpu). Ours is the backend's:
    FlashAttention, or on the CPU up to T = 256 dense score blocks, with the model's dtypes
    under `precision` (bf16: qkv, dout and out bf16; on the CPU the emulation). The naive
    one is float32 on the same values (bf16's rounded), so max_abs_diff_out is our error."""
    H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
    rng = np.random.default_rng(T)
    dtype = lambda name: storage_dtype(precision, name)  # noqa: E731
    qkv_s = stored(precision, "qkv", rng.standard_normal((B, T, cfg.qkv_dim), dtype=np.float32))
    dout_s = stored(precision, "datt", rng.standard_normal((B, T, H * E), dtype=np.float32))
    qkv, dout = be.to_device(qkv_s), be.to_device(dout_s)
    qkv_h, dout_h = as_float32(qkv_s), as_float32(dout_s)  # the naive one's: the same values
    out, lse = be.zeros((B, T, H * E), dtype("att")), be.zeros((B, H, T), dtype("lse"))
    dqkv = be.zeros(qkv_h.shape, dtype("dqkv"))
    flash_f = call_ms(be, lambda: be.attention_forward(out, lse, qkv, H, G, E), reps)
    flash_b = call_ms(be, lambda: be.attention_backward(dqkv, dout, qkv, out, lse, H, G, E), reps)
    if on_gpu:
        from euler.gpu.naive_attention import NaiveAttention

        naive = NaiveAttention(be, qkv_h, dout_h, H, G, E)
        naive_f, naive_b = call_ms(be, naive.forward, reps), call_ms(be, naive.backward, reps)
        naive_out, scores_bytes = naive.out(), naive.scores_bytes()
    else:
        naive_f, naive_b, naive_out, scores_bytes = _naive_numpy(qkv_h, dout_h, H, G, E, reps)
    flash_out = as_float32(be.to_host(out))
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
