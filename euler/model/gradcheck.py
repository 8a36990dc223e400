"""Gradient check: every analytic gradient against float64 finite differences.

Each layer is checked on its own, through the same backend calls the model makes: its
output y = f(inputs) is reduced to the scalar loss sum(y * R) with a fixed random R, so
dloss/dy = R feeds the layer's backward; sampled entries of every input and weight are then
perturbed and compared with the fourth-order central difference

    numeric = (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h,

whose truncation error (~h^4) is far below its rounding noise (~1e-16 |f| / h). The whole
model is checked the same way, with its real loss, on every parameter tensor. Per tensor,

    error = max|analytic - numeric| / max(max|analytic|, max|numeric|, FLOOR)

over the sampled entries: a norm-wise relative error, so that entries whose true gradient
is ~0 compare against the tensor's scale, not against their own rounding noise; FLOOR makes
it an absolute check when the whole sample's gradient is that small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from euler.model.config import PRESETS, ModelConfig
from euler.model.transformer import Model, make_targets

H_STEP = 1e-3
FLOOR = 1e-4
THRESHOLD = 1e-6
CHECK_TILE = 16  # T = 24 and 45 then span 2 and 3 key tiles, the last one partial
ODD_CONFIG = ModelConfig(
    vocab_size=50, d_model=36, n_head=6, n_kv_head=2, n_layer=2, context=45, n_mtp=4
)
# head 0 tied to the embedding: tok_emb's gradient is the scatter plus head 0's product
TIED_CONFIG = dataclasses.replace(PRESETS["tiny"], tie_embeddings=True)


@dataclass
class Row:
    """One line of the report: the worst error over the sampled entries of one tensor."""

    layer: str
    tensor: str
    checked: int
    max_abs: float
    max_rel: float
    threshold: float = THRESHOLD

    @property
    def ok(self) -> bool:
        return bool(self.max_rel <= self.threshold)


def _compare(layer: str, tensor: str, analytic: np.ndarray, numeric: np.ndarray) -> Row:
    diff = float(np.abs(analytic - numeric).max())
    scale = max(float(np.abs(analytic).max()), float(np.abs(numeric).max()), FLOOR)
    return Row(layer, tensor, len(analytic), diff, diff / scale)


def _numeric(loss: Callable[[], float], x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Fourth-order central differences of loss() w.r.t. the flat entries idx of x."""
    flat = x.reshape(-1)
    out = np.empty(len(idx))
    for n, i in enumerate(idx):
        old = flat[i]
        f = []
        for step in (2, 1, -1, -2):
            flat[i] = old + step * H_STEP
            f.append(loss())
        flat[i] = old
        out[n] = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * H_STEP)
    return out


def check_layer(
    layer: str,
    inputs: dict[str, np.ndarray],
    forward: Callable[[dict], np.ndarray],
    backward: Callable[[dict, np.ndarray], dict[str, np.ndarray]],
    rng: np.random.Generator,
    samples: int,
    upstream: float | None = None,
) -> list[Row]:
    """Rows for one layer: forward(inputs) -> y; backward(inputs, dy) -> {name: dinput}.

    dy is random unless `upstream` fixes it to a constant (for a backward that only
    takes a scalar scale, such as the fused cross-entropy).
    """
    y = forward(inputs)
    R = rng.standard_normal(y.shape) if upstream is None else np.full(y.shape, upstream)
    grads = backward(inputs, R)
    rows = []
    for name, x in inputs.items():
        idx = rng.choice(x.size, size=min(samples, x.size), replace=False)
        num = _numeric(lambda: float(np.sum(forward(inputs) * R)), x, idx)
        rows.append(_compare(layer, name, grads[name].reshape(-1)[idx], num))
    return rows


def _layer_checks(cfg: ModelConfig, be, rng: np.random.Generator, samples: int) -> list[Row]:
    """Each layer of `cfg`'s shapes, alone, at B=2 and T=context."""
    from euler.model.transformer import rope_tables

    f8 = np.float64
    B, T, D, F, V = 2, cfg.context, cfg.d_model, cfg.ffn_hidden, cfg.vocab_size
    H, G, E, N = cfg.n_head, cfg.n_kv_head, cfg.head_size, 2 * cfg.context
    rows: list[Row] = []
    randn = lambda *s: rng.standard_normal(s)  # noqa: E731

    tokens = rng.integers(0, V, N).astype(np.int32)

    def emb_f(i):
        x = np.empty((N, D))
        be.embedding_forward(x, tokens, i["tok_emb"])
        return x

    def emb_b(i, dy):
        d = np.empty((V, D))
        be.embedding_backward(d, dy, tokens, accumulate=False)
        return {"tok_emb": d}

    rows += check_layer("embedding", {"tok_emb": randn(V, D)}, emb_f, emb_b, rng, samples)

    def norm_f(i):
        y, r = np.empty((N, D)), np.empty(N)
        be.rmsnorm_forward(y, r, i["x"], i["w"], cfg.norm_eps)
        return y

    def norm_b(i, dy):
        y, r = np.empty((N, D)), np.empty(N)
        be.rmsnorm_forward(y, r, i["x"], i["w"], cfg.norm_eps)
        dx, dw = np.empty((N, D)), np.empty(D)
        be.rmsnorm_backward(dx, dw, dy, np.zeros((N, D)), i["x"], i["w"], r, accumulate=False)
        return {"x": dx, "w": dw}

    rows += check_layer("rmsnorm", {"x": randn(N, D), "w": randn(D)}, norm_f, norm_b, rng, samples)

    def lin_f(i):
        y = np.empty((N, F))
        be.matmul(y, i["x"], i["W"], trans_b=True)
        return y

    def lin_b(i, dy):
        dx, dW = np.empty((N, D)), np.empty((F, D))
        be.matmul(dx, dy, i["W"])
        be.matmul(dW, dy, i["x"], trans_a=True)
        return {"x": dx, "W": dW}

    rows += check_layer("linear", {"x": randn(N, D), "W": randn(F, D)}, lin_f, lin_b, rng, samples)

    cos, sin = rope_tables(cfg, f8)

    def rope_f(i):
        y = i["qkv"].copy()
        be.rope_forward(y, cos, sin, H, G, E)
        return y

    def rope_b(i, dy):
        d = dy.copy()
        be.rope_backward(d, cos, sin, H, G, E)
        return {"qkv": d}

    qkv = randn(B, T, cfg.qkv_dim)
    rows += check_layer("rope", {"qkv": qkv}, rope_f, rope_b, rng, samples)

    def att_f(i):
        out, lse = np.empty((B, T, H * E)), np.empty((B, H, T))
        be.attention_forward(out, lse, i["qkv"], H, G, E)
        return out

    def att_b(i, dy):
        out, lse = np.empty((B, T, H * E)), np.empty((B, H, T))
        be.attention_forward(out, lse, i["qkv"], H, G, E)
        d = np.empty_like(i["qkv"])
        be.attention_backward(d, dy, i["qkv"], out, lse, H, G, E)
        return {"qkv": d}

    rows += check_layer("attention", {"qkv": randn(B, T, cfg.qkv_dim)}, att_f, att_b, rng, samples)

    def glu_f(i):
        h = np.empty((N, F))
        be.swiglu_forward(h, i["gu"])
        return h

    def glu_b(i, dy):
        d = np.empty((N, 2 * F))
        be.swiglu_backward(d, dy, i["gu"])
        return {"gu": d}

    rows += check_layer("swiglu", {"gu": randn(N, 2 * F)}, glu_f, glu_b, rng, samples)

    def res_f(i):
        y = np.empty((N, D))
        be.residual_forward(y, i["a"], i["b"])
        return y

    rows += check_layer(
        "residual", {"a": randn(N, D), "b": randn(N, D)}, res_f,
        lambda i, dy: {"a": dy, "b": dy}, rng, samples,
    )  # fmt: skip

    targets = rng.integers(-1, V, N).astype(np.int32)  # some rows with no target
    scale = 0.37

    def ce_f(i):
        losses = np.empty(N)
        be.cross_entropy_forward(losses, i["logits"], targets)
        return losses

    def ce_b(i, dy):
        d = i["logits"].copy()
        be.cross_entropy_forward_backward(np.empty(N), d, targets, np.array([scale]), 0)
        return {"logits": d}

    logits = {"logits": randn(N, V) * 3}
    rows += check_layer("cross_entropy", logits, ce_f, ce_b, rng, samples, upstream=scale)
    return rows


def _model_check(
    name: str, cfg: ModelConfig, be, rng: np.random.Generator, samples: int
) -> list[Row]:
    """Whole-model loss gradient on sampled entries of every parameter tensor."""
    model = Model(cfg, backend=be, dtype=np.float64, seed=int(rng.integers(1 << 30)))
    # larger-than-init weights so that every path carries signal
    model.params[:] += rng.standard_normal(model.layout.size) * 0.05
    B, T, K = 2, cfg.context, cfg.n_mtp
    window = rng.integers(0, cfg.vocab_size, (B, T + K - 1))  # last head misses some targets
    tokens, targets = window[:, :T], make_targets(window, T, K)
    model.forward(tokens, targets, need_grad=True)
    model.backward()
    grads = model.grads.copy()
    loss = lambda: model.forward(tokens, targets)  # noqa: E731
    rows = []
    for tname, (off, shape) in model.layout.offsets.items():
        size = int(np.prod(shape))
        idx = off + rng.choice(size, size=min(samples, size), replace=False)
        rows.append(_compare(name, tname, grads[idx], _numeric(loss, model.params, idx)))
    return rows


def _flash_vs_naive(cfg: ModelConfig, be, rng: np.random.Generator) -> Row:
    """FlashAttention's output against softmax(Q K^T / sqrt(E)) V materialised in NumPy."""
    B, T, H, G, E = 2, cfg.context, cfg.n_head, cfg.n_kv_head, cfg.head_size
    qkv = rng.standard_normal((B, T, cfg.qkv_dim))
    out, lse = np.empty((B, T, H * E)), np.empty((B, H, T))
    be.attention_forward(out, lse, qkv, H, G, E)
    q = qkv[..., : H * E].reshape(B, T, H, E)
    k = qkv[..., H * E : (H + G) * E].reshape(B, T, G, E)
    v = qkv[..., (H + G) * E :].reshape(B, T, G, E)
    rep = H // G
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bihe,bjhe->bhij", q, k) / np.sqrt(E)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("bhij,bjhe->bihe", p, v).reshape(B, T, H * E)
    diff = float(np.abs(out - ref).max())
    return Row("flash vs naive", f"T={T} H/G={H}/{G}", out.size, diff, diff, 1e-12)


def _f32_vs_f64(cfg: ModelConfig, rng: np.random.Generator) -> Row:
    """The float32 model's loss against the float64 model's on the same weights."""
    m64 = Model(cfg, dtype=np.float64, seed=3)
    m32 = Model(cfg, dtype=np.float32, flat_params=m64.params.astype(np.float32))
    window = rng.integers(0, cfg.vocab_size, (2, cfg.context + cfg.n_mtp))
    tokens, targets = window[:, : cfg.context], make_targets(window, cfg.context, cfg.n_mtp)
    l64 = m64.forward(tokens, targets)
    l32 = m32.forward(tokens, targets)
    rel = abs(l32 - l64) / abs(l64)
    return Row("float32 vs float64", "loss", 1, abs(l32 - l64), rel, 1e-5)


def gradcheck_rows(seed: int = 0, samples: int = 12, threads: int = 1) -> list[Row]:
    """All checks: layers and whole model for `tiny` and the odd-shaped config, and the
    whole model of `tiny` with tied embeddings.

    Runs on `threads` threads, one by default: at these sizes a parallel region costs more
    than its work.
    """
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return _all_rows(seed, samples)
    finally:
        numba.set_num_threads(before)


def _all_rows(seed: int, samples: int) -> list[Row]:
    from euler.cpu.backend import CpuBackend

    be = CpuBackend(attention_tile=CHECK_TILE)
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    for cname, cfg in (("tiny", PRESETS["tiny"]), ("odd", ODD_CONFIG)):
        for r in _layer_checks(cfg, be, rng, samples):
            r.layer = f"{cname}: {r.layer}"
            rows.append(r)
        rows += _model_check(f"{cname}: model", cfg, be, rng, samples)
        rows.append(_flash_vs_naive(cfg, be, rng))
        rows[-1].layer = f"{cname}: {rows[-1].layer}"
        rows.append(_f32_vs_f64(cfg, rng))
        rows[-1].layer = f"{cname}: {rows[-1].layer}"
    rows += _model_check("tied: model", TIED_CONFIG, be, rng, samples)
    return rows


def run_gradcheck(seed: int = 0, samples: int = 12, threads: int = 1) -> bool:
    """Print the report table (checks run on `threads` threads); True when every row is
    within its threshold."""
    from rich.console import Console
    from rich.table import Table

    rows = gradcheck_rows(seed, samples, threads)
    table = Table(title=f"gradient check (float64, 4th-order central differences, h = {H_STEP:g})")
    for col in ("config", "layer", "tensor", "checked", "max abs err", "max rel err", "limit"):
        left = col in ("config", "layer", "tensor")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    table.add_column("")
    for r in rows:
        config, _, layer = r.layer.partition(": ")
        table.add_row(
            config, layer, r.tensor, str(r.checked), f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
            f"{r.threshold:.0e}", "ok" if r.ok else "FAIL",
        )  # fmt: skip
    console = Console(width=max(Console().width, 110))
    console.print(table)
    console.print(
        "rel err = max|analytic - numeric| / max(max|analytic|, max|numeric|, "
        f"{FLOOR:g}) over a tensor's sampled entries"
    )
    bad = [r for r in rows if not r.ok]
    worst = max(rows, key=lambda r: r.max_rel / r.threshold)
    console.print(
        f"{len(rows)} rows, {len(bad)} failed; worst {worst.layer} {worst.tensor}: "
        f"{worst.max_rel:.2e} (limit {worst.threshold:.0e})"
    )
    return not bad
