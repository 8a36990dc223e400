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

Each layer with parameters or saved statistics has a backward twin (`*_backward`): given
the forward's inputs and the gradient of the loss at its output, the gradients at its
inputs, written from the chain rule as plainly as the forward.
"""

from __future__ import annotations

import math

import numpy as np

from euler.model.config import ModelConfig


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """(..., D), (D,) -> (..., D): x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rmsnorm_backward(
    x: np.ndarray, w: np.ndarray, eps: float, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(dx (..., D), dw (D,)) of y = rmsnorm(x, w, eps) for the output gradient dy (..., D).

    With r = (mean(x^2) + eps)^(-1/2), xhat = x r and g = dy w: dr/dx_i = -r^3 x_i / D, so
    dx = r g - xhat mean(g xhat); dw sums dy xhat over every row.
    """
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    g = dy * w
    dx = r * g - xhat * r * np.mean(g * xhat, axis=-1, keepdims=True)
    dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx, dw


def silu(z: np.ndarray) -> np.ndarray:
    """Elementwise z * sigmoid(z)."""
    return z / (1.0 + np.exp(-z))


def swiglu_backward(
    gate: np.ndarray, up: np.ndarray, dh: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(dgate, dup) of h = silu(gate) * up for dh, all of one shape.

    silu'(z) = sigmoid(z) + z sigmoid(z) (1 - sigmoid(z)).
    """
    sig = 1.0 / (1.0 + np.exp(-gate))
    return dh * up * (sig + gate * sig * (1.0 - sig)), dh * gate * sig


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


def rope_backward(dy: np.ndarray, base: float, start: int = 0) -> np.ndarray:
    """(B, T, N, E) -> (B, T, N, E): the gradient at rope's input for dy at its output.

    Each pair's rotation [[c, -s], [s, c]] is transposed: dx1 = dy1 c + dy2 s and
    dx2 = dy2 c - dy1 s, with the angles of `rope`.
    """
    _, T, _, E = dy.shape
    half = E // 2
    inv_freq = base ** (-2.0 * np.arange(half) / E)
    angle = np.arange(start, start + T)[:, None] * inv_freq[None, :]
    cos = np.cos(angle).astype(dy.dtype)[None, :, None, :]
    sin = np.sin(angle).astype(dy.dtype)[None, :, None, :]
    d1, d2 = dy[..., :half], dy[..., half:]
    return np.concatenate([d1 * cos + d2 * sin, d2 * cos - d1 * sin], axis=-1)


def _causal_probs(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(B, T, H, E), (B, T, H, E) -> (B, H, T, T): softmax(q k^T / sqrt(E)) over the keys,
    keys after the query masked out."""
    T, E = q.shape[1], q.shape[3]
    # a Python float divisor, because a NumPy float64 scalar would promote float32 scores
    scores = np.einsum("bthe,bshe->bhts", q, k) / math.sqrt(E)  # (B, H, T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return p / p.sum(axis=-1, keepdims=True)


def _repeat_kv(k: np.ndarray, v: np.ndarray, H: int) -> tuple[np.ndarray, np.ndarray]:
    """kv heads (B, T, G, E) repeated to the H query heads: head h gets kv head h // (H/G)
    (np.repeat turns kv heads [0, 1] into [0, 0, 1, 1])."""
    G = k.shape[2]
    return np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(B, T, H, E), (B, T, G, E), (B, T, G, E) -> (B, T, H, E): causal GQA attention.

    Materialises the full (B, H, T, T) score matrix: softmax(q k^T / sqrt(E)) v with keys
    after the query masked out; query head h reads kv head h // (H / G).
    """
    B, T, H, E = q.shape
    G = k.shape[2]
    assert k.shape == (B, T, G, E) and v.shape == (B, T, G, E) and H % G == 0
    k, v = _repeat_kv(k, v, H)
    return np.einsum("bhts,bshe->bthe", _causal_probs(q, k), v)


def naive_attention_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq (B, T, H, E), dk, dv (B, T, G, E)) of naive_attention(q, k, v) for dout (B, T, H, E).

    With P the probabilities and O = P V: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P))
    (the softmax's Jacobian), dQ = dS K / sqrt(E), dK = dS^T Q / sqrt(E). A kv head's
    gradient sums those of the H/G query heads that read it.
    """
    B, T, H, E = q.shape
    G = k.shape[2]
    assert k.shape == (B, T, G, E) and v.shape == (B, T, G, E) and dout.shape == q.shape
    kr, vr = _repeat_kv(k, v, H)
    p = _causal_probs(q, kr)  # (B, H, T, T)
    dv = np.einsum("bhts,bthe->bshe", p, dout)
    dp = np.einsum("bthe,bshe->bhts", dout, vr)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhts,bshe->bthe", ds, kr) / math.sqrt(E)
    dk = np.einsum("bhts,bthe->bshe", ds, q) / math.sqrt(E)

    def group(x):  # (B, T, H, E) -> (B, T, G, E), query heads h // (H/G) = g summed
        return x.reshape(B, T, G, H // G, E).sum(axis=3)

    return dq, group(dk), group(dv)


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


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(K, B, T, V), (K, B, T) -> dlogits (K, B, T, V) of cross_entropy_loss.

    Head k's positions with a target weigh 1 / (its target count * the heads with any):
    there dlogits = (softmax - onehot(target)) times that weight; 0 where target < 0 and
    in every head without targets (the loss ignores them).
    """
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    valid = targets >= 0
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, np.where(valid, targets, 0)[..., None], 1.0, axis=-1)
    counts = valid.sum(axis=(1, 2))  # (K,)
    active = int((counts > 0).sum())
    weight = np.where(counts > 0, 1.0 / (np.maximum(counts, 1) * max(active, 1)), 0.0)
    return (p - onehot) * (valid * weight[:, None, None])[..., None].astype(logits.dtype)


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
    # tied: head 0 is the embedding matrix, mtp_heads holds heads 1..K-1
    own = [params["mtp_heads"]] if "mtp_heads" in params else []
    heads = np.concatenate([params["tok_emb"][None], *own]) if cfg.tie_embeddings else own[0]
    logits = np.einsum("btd,kvd->kbtv", xf, heads)  # (K, B, T, V)

    if targets is None:
        return None, logits
    assert targets.shape == (cfg.n_mtp, B, T)
    return cross_entropy_loss(logits, targets), logits
