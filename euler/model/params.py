"""Parameters as one flat buffer cut into named views.

The ordered table of (name, shape, decay) is the single source of offsets: the flat
parameter, gradient and AdamW moment buffers all share it, so optimizer steps, gradient
clipping, checkpoints and all-reduce each touch one contiguous array.

Weight matrices come first and the norm weights last, so weight decay applies to the
prefix [0, n_decay) of the flat buffer and not to the suffix. Within a layer the q, k, v
projections are adjacent (one fused (H*E + 2*G*E, D) matrix for a single GEMM), and so are
the SwiGLU gate and up projections (one fused (2F, D) matrix). Linear weights are stored
(out, in), as in PyTorch and Hugging Face.
"""

from __future__ import annotations

import numpy as np

from euler.model.config import ModelConfig


def param_table(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """Ordered (name, shape, weight_decay) for every parameter tensor."""
    V, D, F, K = cfg.vocab_size, cfg.d_model, cfg.ffn_hidden, cfg.n_mtp
    table: list[tuple[str, tuple[int, ...], bool]] = [("tok_emb", (V, D), True)]
    for layer in range(cfg.n_layer):
        p = f"layers.{layer}."
        table += [
            (p + "attn.wq", (cfg.q_dim, D), True),
            (p + "attn.wk", (cfg.kv_dim, D), True),
            (p + "attn.wv", (cfg.kv_dim, D), True),
            (p + "attn.wo", (D, cfg.q_dim), True),
            (p + "mlp.w_gate", (F, D), True),
            (p + "mlp.w_up", (F, D), True),
            (p + "mlp.w_down", (D, F), True),
        ]
    # tied: head 0 is tok_emb, so only heads 1..K-1 have their own matrices
    n_own = K - 1 if cfg.tie_embeddings else K
    if n_own:
        table.append(("mtp_heads", (n_own, V, D), True))
    for layer in range(cfg.n_layer):
        p = f"layers.{layer}."
        table += [(p + "attn_norm", (D,), False), (p + "mlp_norm", (D,), False)]
    table.append(("final_norm", (D,), False))
    return table


class ParamLayout:
    """Offsets of every named tensor inside the flat buffer, computed from param_table."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.table = param_table(cfg)
        self.offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        off = 0
        self.n_decay = 0
        for name, shape, decay in self.table:
            self.offsets[name] = (off, shape)
            off += int(np.prod(shape))
            if decay:
                self.n_decay = off
        self.size = off

    def views(self, flat) -> dict[str, object]:
        """Named views into `flat` (NumPy or device array, 1-D, length `size`)."""
        out = {}
        for name, (off, shape) in self.offsets.items():
            out[name] = flat[off : off + int(np.prod(shape))].reshape(shape)
        # fused views for the two concatenated projections of each layer
        D = self.cfg.d_model
        for layer in range(self.cfg.n_layer):
            p = f"layers.{layer}."
            off_q, _ = self.offsets[p + "attn.wq"]
            out[p + "attn.wqkv"] = flat[off_q : off_q + self.cfg.qkv_dim * D].reshape(
                self.cfg.qkv_dim, D
            )
            off_g, _ = self.offsets[p + "mlp.w_gate"]
            F = self.cfg.ffn_hidden
            out[p + "mlp.w_gateup"] = flat[off_g : off_g + 2 * F * D].reshape(2 * F, D)
        return out


def head_weights(cfg: ModelConfig, views: dict) -> list:
    """The K head matrices (V, D) out of `views` (ParamLayout.views of params, grads or a
    bf16 copy): head 0 is views["tok_emb"] when cfg.tie_embeddings, else mtp_heads[0]."""
    heads = views.get("mtp_heads")
    own = [heads[k] for k in range(heads.shape[0])] if heads is not None else []
    return [views["tok_emb"], *own] if cfg.tie_embeddings else own


def init_params(layout: ParamLayout, seed: int, dtype=np.float32) -> np.ndarray:
    """Deterministic initialisation from `seed`: N(0, std) matrices, ones for norm weights.

    The output projections (wo, w_down) are scaled by 1/sqrt(2 L), as in GPT-2, so the
    residual stream's variance does not grow with depth. Each tensor draws from its own
    stream (seeded by seed and its index), so the values do not depend on the dtype.
    """
    cfg = layout.cfg
    flat = np.empty(layout.size, dtype=dtype)
    std = cfg.init_std
    for i, (name, shape, _) in enumerate(layout.table):
        off, _ = layout.offsets[name]
        n = int(np.prod(shape))
        if name.endswith("norm"):
            flat[off : off + n] = 1.0
            continue
        s = std / np.sqrt(2.0 * cfg.n_layer) if name.endswith(("wo", "w_down")) else std
        rng = np.random.default_rng([seed, i])
        flat[off : off + n] = rng.standard_normal(n) * s
    return flat
