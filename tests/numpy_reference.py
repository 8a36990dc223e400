"""An independent plain-NumPy forward of the whole model: the oracle for the engine's loss.

Written straight from the math, with no tiling, no Numba and nothing imported from the
engine except the config and the parameter names, so that a mistake in a kernel cannot be
copied into the reference. Every function works in the dtype of its inputs (tests use
float64, where agreement to 1e-10 is meaningful).

The math (shape letters from euler/model/config.py; linear weights are stored (out, in), so a
projection is y = x @ W.T; no biases anywhere):

    x = tok_emb[tokens]                                            (B, T, D)
    for each layer l:
        h = rmsnorm(x, attn_norm)
        q = rope(h @ wq.T)  (B, T, H, E);  k = rope(h @ wk.T), v = h @ wv.T  (B, T, G, E)
        att = causal softmax(q k^T / sqrt(E)) v, query head h reading kv head h // (H / G)
        x = x + concat_heads(att) @ wo.T
        h = rmsnorm(x, mlp_norm)
        x = x + (silu(h @ w_gate.T) * (h @ w_up.T)) @ w_down.T
    logits[k] = rmsnorm(x, final_norm) @ mtp_heads[k].T           (K, B, T, V)

    rmsnorm(x, w) = x / sqrt(mean(x^2 over D) + norm_eps) * w
    silu(z) = z / (1 + exp(-z))
    rope, Hugging Face Llama "rotate halves": for i in [0, E/2), at position t,
        a = t * rope_base^(-2i/E)
        out[i]       = x[i] cos(a) - x[i + E/2] sin(a)
        out[i + E/2] = x[i + E/2] cos(a) + x[i] sin(a)

    targets[k, b, t] = window[b, t + 1 + k], or -1 where the window has no such token
    loss_k = mean over (b, t) with targets[k, b, t] >= 0 of
             logsumexp(logits[k, b, t]) - logits[k, b, t, targets[k, b, t]]
    loss   = mean of loss_k over the heads k that have at least one target
"""

from __future__ import annotations

import math

import numpy as np

from euler.model.config import ModelConfig


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """(..., D), (D,) -> (..., D): x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(z: np.ndarray) -> np.ndarray:
    """Elementwise z * sigmoid(z)."""
    return z / (1.0 + np.exp(-z))


def rope(x: np.ndarray, base: float, start: int = 0) -> np.ndarray:
    """(B, T, N, E) -> (B, T, N, E): rotate-halves RoPE, sequence position t at start + t.

    The angles are computed in float64 and cast, so a float32 input sees the same angles
    as a float64 one up to rounding of the final cos and sin.
    """
    _, T, _, E = x.shape
    half = E // 2
    inv_freq = base ** (-2.0 * np.arange(half) / E)  # (E/2,)
    angle = np.arange(start, start + T)[:, None] * inv_freq[None, :]  # (T, E/2)
    cos = np.cos(angle).astype(x.dtype)[None, :, None, :]
    sin = np.sin(angle).astype(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(B, T, H, E), (B, T, G, E), (B, T, G, E) -> (B, T, H, E): causal GQA attention.

    Materialises the full (B, H, T, T) score matrix: softmax(q k^T / sqrt(E)) v with keys
    after the query masked out; query head h reads kv head h // (H / G).
    """
    B, T, H, E = q.shape
    G = k.shape[2]
    assert k.shape == (B, T, G, E) and v.shape == (B, T, G, E) and H % G == 0
    # np.repeat turns kv heads [0, 1] into [0, 0, 1, 1]: head h gets kv head h // (H/G)
    k = np.repeat(k, H // G, axis=2)
    v = np.repeat(v, H // G, axis=2)
    # a Python float divisor, because a NumPy float64 scalar would promote float32 scores
    scores = np.einsum("bthe,bshe->bhts", q, k) / math.sqrt(E)  # (B, H, T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhts,bshe->bthe", p, v)


def attention_with_grads(qkv: np.ndarray, dout: np.ndarray, H: int, G: int, E: int):
    """(out, lse, dqkv) of causal grouped-query attention in float64, dense: qkv (B, T,
    (H + 2G) E) and dout (B, T, H E); the oracle of the GPU attention kernels' tests."""
    qkv = qkv.astype(np.float64)
    B, T, _ = qkv.shape
    rep = H // G
    q = qkv[..., : H * E].reshape(B, T, H, E)
    k = np.repeat(qkv[..., H * E : (H + G) * E].reshape(B, T, G, E), rep, axis=2)
    v = np.repeat(qkv[..., (H + G) * E :].reshape(B, T, G, E), rep, axis=2)
    s = np.einsum("bihe,bjhe->bhij", q, k, optimize=True) / math.sqrt(E)
    s[..., np.triu(np.ones((T, T), bool), 1)] = -np.inf
    m = s.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(-1))
    p = np.exp(s - lse[..., None])
    o = np.einsum("bhij,bjhe->bihe", p, v, optimize=True)
    do = dout.astype(np.float64).reshape(B, T, H, E)
    dv = np.einsum("bhij,bihe->bjhe", p, do, optimize=True)
    ds = p * (
        np.einsum("bihe,bjhe->bhij", do, v, optimize=True)
        - np.einsum("bihe,bihe->bhi", do, o, optimize=True)[..., None]
    )
    dq = np.einsum("bhij,bjhe->bihe", ds, k, optimize=True) / math.sqrt(E)
    dk = np.einsum("bhij,bihe->bjhe", ds, q, optimize=True) / math.sqrt(E)

    def group(x):  # a kv head's gradient sums over its group's query heads
        return x.reshape(B, T, G, rep, E).sum(3).reshape(B, T, G * E)

    dqkv = np.concatenate([dq.reshape(B, T, H * E), group(dk), group(dv)], -1)
    return o.reshape(B, T, H * E), lse, dqkv


def make_targets(window: np.ndarray, T: int, K: int) -> np.ndarray:
    """(B, W) int -> (K, B, T) int: targets[k, b, t] = window[b, t+1+k], -1 past the window end.

    W is usually T + K (every head has a target everywhere) or T (head k has none in the
    last k + 1 positions). The inputs are window[:, :T].
    """
    B, W = window.shape
    assert W >= T
    targets = np.full((K, B, T), -1, dtype=np.int64)
    for k in range(K):
        n = min(T, W - 1 - k)  # positions t with t + 1 + k < W
        if n > 0:
            targets[k, :, :n] = window[:, 1 + k : 1 + k + n]
    return targets


def cross_entropy_loss(logits: np.ndarray, targets: np.ndarray) -> float | None:
    """(K, B, T, V), (K, B, T) -> mean over heads with a target of each head's mean CE.

    Returns None when no head has any target.
    """
    m = logits.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[..., 0]  # (K, B, T)
    valid = targets >= 0
    picked = np.take_along_axis(logits, np.where(valid, targets, 0)[..., None], axis=-1)[..., 0]
    nll = np.where(valid, lse - picked, 0.0)
    counts = valid.sum(axis=(1, 2))  # (K,)
    head_losses = [nll[k].sum() / counts[k] for k in range(len(counts)) if counts[k] > 0]
    return float(np.mean(head_losses)) if head_losses else None


def reference_forward(
    cfg: ModelConfig,
    params: dict[str, np.ndarray],
    tokens: np.ndarray,
    targets: np.ndarray | None,
) -> tuple[float | None, np.ndarray]:
    """(B, T) tokens, (K, B, T) targets or None -> (loss or None, logits (K, B, T, V)).

    `params` maps the names of euler.model.params.param_table to arrays of those shapes (e.g.
    ParamLayout(cfg).views(flat)); the computation runs in their dtype.
    """
    B, T = tokens.shape
    H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
    assert T <= cfg.context
    assert tokens.min() >= 0 and tokens.max() < cfg.vocab_size
    eps = cfg.norm_eps

    x = params["tok_emb"][tokens]  # (B, T, D)
    for layer in range(cfg.n_layer):
        p = f"layers.{layer}."
        h = rmsnorm(x, params[p + "attn_norm"], eps)
        q = rope((h @ params[p + "attn.wq"].T).reshape(B, T, H, E), cfg.rope_base)
        k = rope((h @ params[p + "attn.wk"].T).reshape(B, T, G, E), cfg.rope_base)
        v = (h @ params[p + "attn.wv"].T).reshape(B, T, G, E)
        att = naive_attention(q, k, v).reshape(B, T, H * E)
        x = x + att @ params[p + "attn.wo"].T
        h = rmsnorm(x, params[p + "mlp_norm"], eps)
        gate = silu(h @ params[p + "mlp.w_gate"].T)
        x = x + (gate * (h @ params[p + "mlp.w_up"].T)) @ params[p + "mlp.w_down"].T
    xf = rmsnorm(x, params["final_norm"], eps)
    logits = np.einsum("btd,kvd->kbtv", xf, params["mtp_heads"])  # (K, B, T, V)

    if targets is None:
        return None, logits
    assert targets.shape == (cfg.n_mtp, B, T)
    return cross_entropy_loss(logits, targets), logits
