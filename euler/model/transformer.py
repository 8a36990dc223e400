"""The transformer's forward and backward passes, written against a backend.

The model does not know its device: it holds flat parameter and gradient buffers from the
backend, an activation arena sized for (B, T), and calls the backend's layer methods in the
order below. Each block is  x = x + attn(rmsnorm(x));  x = x + mlp(rmsnorm(x)),  then a
final RMSNorm feeds K multi-token-prediction heads (head k predicts token t+1+k).

The heads' backward is fused into the forward: as soon as head k's logits are turned into
dlogits by the fused cross-entropy, its weight gradient and its share of dxf are computed,
so only one head's logits ever exist.

Decoding runs the same forward (Model.layers) with a KV cache: its rows are tokens of
several sequences, each at its own position, and where the two differ the layer calls pick
the decoding kernels (decode_linear: each row's product alone, so a row's bits do not depend
on the rows beside it; decode_attention: the row attends to its sequence's cached keys).

Under --precision bf16 the buffers euler.precision.BF16_TENSORS names are bf16 (the
products' inputs and most of their outputs) and the products read bf16 copies of the
weights (params_lp), which AdamW refreshes; everything else stays float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from euler.backend import Array, Backend, Product, make_backend
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights, init_params
from euler.precision import check_precision, host_values, storage_dtype, to_bf16


def rope_tables(cfg: ModelConfig, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (context, E/2) for positions 0..context-1, computed in float64, then cast."""
    E = cfg.head_size
    inv_freq = cfg.rope_base ** (-np.arange(0, E, 2, dtype=np.float64) / E)
    angles = np.arange(cfg.context, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def make_targets(
    window: np.ndarray,
    T: int,
    K: int,
    mask: np.ndarray | None = None,
    segments: np.ndarray | None = None,
) -> np.ndarray:
    """Targets (K, B, T) int32 for inputs window[:, :T]: head k at t predicts window[:, t+1+k].

    A position whose target lies past the window's end, or whose target token has mask 0,
    or (given segments) lies in another segment than the position, gets -1 (no target).
    window, mask and segments (B, N) with N >= T.
    """
    B, N = window.shape
    targets = np.full((K, B, T), -1, dtype=np.int32)
    for k in range(K):
        n = min(T, N - 1 - k)
        if n <= 0:
            continue
        targets[k, :, :n] = window[:, 1 + k : 1 + k + n]
        if mask is not None:
            targets[k, :, :n][mask[:, 1 + k : 1 + k + n] == 0] = -1
        if segments is not None:
            targets[k, :, :n][segments[:, :n] != segments[:, 1 + k : 1 + k + n]] = -1
    return targets


def head_scales(targets: np.ndarray) -> np.ndarray:
    """Per-head loss weights (K,): 1 / (targets of head k * heads that have any), else 0.

    The loss is the mean over heads (that have a target) of each head's mean cross-entropy.
    """
    counts = (targets >= 0).reshape(targets.shape[0], -1).sum(axis=1).astype(np.float64)
    active = int((counts > 0).sum())
    scales = np.zeros(len(counts), dtype=np.float64)
    if active:
        scales[counts > 0] = 1.0 / (counts[counts > 0] * active)
    return scales


class Activations:
    """Every buffer one forward/backward at (B, T) needs, allocated once by the backend;
    each in dtype, or bf16 where precision bf16 stores it (euler.precision.BF16_TENSORS).

    Row tensors are (N, C) with N = B T rows; attention's lse is (B, H, T) and its backward
    scratch (dqkv, datt) (B, T, C). cached: the arena of a decoding forward, which keeps
    nothing for a backward: one buffer of each name serves every layer (x and xmid two, as
    each layer reads one while it writes the other), and no heads or backward buffers.
    """

    def __init__(
        self, cfg: ModelConfig, backend, dtype, B: int, T: int, precision="fp32",
        cached: bool = False,
    ):  # fmt: skip
        D, F, V, K = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.n_mtp
        H, QKV = cfg.n_head, cfg.qkv_dim
        L, N = cfg.n_layer, B * T

        def z(name, *shape, n=None):
            dt = storage_dtype(precision, name, dtype)
            if n is None:
                return backend.zeros(shape, dt)
            if cached:
                return [backend.zeros(shape, dt)] * n
            return [backend.zeros(shape, dt) for _ in range(n)]

        self.B, self.T = B, T
        self.x = z("x", N, D, n=L + 1)  # residual stream at each layer input
        self.xn1 = z("xn1", N, D, n=L)  # attention norm output
        self.rstd1 = z("rstd1", N, n=L)
        self.qkv = z("qkv", N, QKV, n=L)  # q, k after RoPE
        self.att = z("att", N, cfg.q_dim, n=L)
        self.lse = None if cached else z("lse", B, H, T, n=L)  # decode_attention keeps none
        self.xmid = z("xmid", N, D, n=L)  # after the attention residual
        self.xn2 = z("xn2", N, D, n=L)
        self.rstd2 = z("rstd2", N, n=L)
        self.gu = z("gu", N, 2 * F, n=L)  # gate | up
        self.h = z("h", N, F, n=L)  # silu(gate) * up
        self.xf = z("xf", N, D)
        self.rstdf = z("rstdf", N)
        # inputs staged into fixed buffers, so a step uploads without allocating
        self.tokens = backend.zeros((N,), np.int32)
        if cached:
            return
        self.logits = z("logits", N, V)  # one head at a time
        self.losses = z("losses", K, N)
        self.targets = backend.zeros((K, N), np.int32)
        # backward scratch
        self.dx = z("dx", N, D)
        self.dxn = z("dxn", N, D)
        self.dxf = z("dxf", N, D)
        self.zero_bt_d = z("zero_bt_d", N, D)
        self.dqkv = z("dqkv", B, T, QKV)
        # bf16: RoPE's backward writes the products' bf16 copy of dqkv (attention's dQ
        # adds up in float32); float32 rotates dqkv in place
        self.dqkv_lp = z("dqkv_lp", B, T, QKV) if precision == "bf16" else self.dqkv
        self.datt = z("datt", B, T, cfg.q_dim)
        self.dgu = z("dgu", N, 2 * F)
        self.dh = z("dh", N, F)


class KVCache(NamedTuple):
    """A decoding forward's cache and where its rows go in it: the rows of one call are
    tokens of any of S sequences (cache slots), each at its own position."""

    k: Sequence[Array]  # per layer (S, G, C, E): keys after RoPE
    v: Sequence[Array]  # per layer (S, G, C, E): values
    slots: Array  # (N,) int32: each row's sequence
    positions: Array  # (N,) int32: each row's position in it
    cos: Array  # (N, E/2): RoPE's table rows at those positions
    sin: Array


class _ByteCounter:
    """A backend stand-in whose zeros() only adds up the bytes asked for."""

    def __init__(self):
        self.total = 0

    def zeros(self, shape, dtype) -> None:
        self.total += int(np.prod(shape)) * np.dtype(dtype).itemsize


def arena_bytes(cfg: ModelConfig, dtype, B: int, T: int, precision: str = "fp32") -> int:
    """Bytes of the activation arena for micro-batches (B, T), counted without allocating."""
    counter = _ByteCounter()
    Activations(cfg, counter, dtype, B, T, precision)
    return counter.total


def _2d(a):
    """(B, T, C) -> (B T, C) view."""
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def _3d(a, B: int, T: int):
    """(B T, C) -> (B, T, C) view."""
    return a.reshape(B, T, a.shape[1])


class Model:
    """Parameters, gradients and the forward/backward schedule of one model on one backend.

    precision "bf16" keeps float32 master weights (params) and gives the products bf16
    copies (params_lp, refreshed by AdamW and by sync_lowp); "fp32" and "tf32" are the
    same model (TF32 is the GPU backend's choice of product). train=False: a decoding
    model, without the gradient buffer.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        backend: Backend | None = None,
        dtype=np.float32,
        seed: int = 0,
        flat_params: np.ndarray | None = None,
        precision: str = "fp32",
        train: bool = True,
    ):
        if backend is None:
            backend = make_backend("cpu")
        self.cfg = cfg
        self.be = backend
        self.dtype = np.dtype(dtype)
        self.layout = ParamLayout(cfg)
        host = init_params(self.layout, seed, self.dtype) if flat_params is None else flat_params
        if host.shape != (self.layout.size,):
            raise EulerError(
                f"parameters: expected {self.layout.size} values for this config, got {host.size}"
            )
        self.precision = check_precision(precision)
        if precision == "bf16" and self.dtype != np.float32:
            raise EulerError(f"precision bf16 keeps float32 master weights, not {self.dtype}")
        self.params = backend.to_device(np.ascontiguousarray(host, dtype=self.dtype))
        self.grads = backend.zeros((self.layout.size,), self.dtype) if train else None
        self.p = self.layout.views(self.params)
        self.g = self.layout.views(self.grads) if train else None
        self.params_lp = None  # bf16: the weights the products read
        self.w = self.p  # the products' weight views: p, or params_lp's under bf16
        if precision == "bf16":
            self.params_lp = backend.to_device(to_bf16(host))
            self.w = self.layout.views(self.params_lp)
        # the K head matrices (V, D); head 0 is tok_emb's view itself when tied
        self.heads_w = head_weights(cfg, self.w)
        self.heads_g = head_weights(cfg, self.g) if train else None
        cos, sin = rope_tables(cfg, self.dtype)
        self.cos, self.sin = backend.to_device(cos), backend.to_device(sin)
        self.acts: Activations | None = None
        self._tokens = None
        self._accumulate = False
        self._scales = None  # staged head weights (K,); None when no targets are staged
        self.arena_version = 0  # counts arena allocations: a captured step holds its addresses

    # ------------------------------------------------------------------ helpers
    def sync_lowp(self) -> None:
        """Refresh the bf16 weight copies from params after params were written from
        outside (a checkpoint loaded, a broadcast); nothing to do without them."""
        if self.params_lp is not None:
            self.be.copy_(self.params_lp, to_bf16(self.be.to_host(self.params)))

    def _arena(self, B: int, T: int) -> Activations:
        if self.acts is None or (self.acts.B, self.acts.T) != (B, T):
            self.acts = None  # free the old arena before the new one is allocated
            self.acts = Activations(self.cfg, self.be, self.dtype, B, T, self.precision)
            self.arena_version += 1
        return self.acts

    def _check_inputs(self, tokens: np.ndarray, targets: np.ndarray | None) -> None:
        if tokens.ndim != 2:
            raise EulerError(f"tokens: expected shape (B, T), got {tokens.shape}")
        self.cfg.check_sequence(tokens.shape[1])
        V = self.cfg.vocab_size
        if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
            bad = tokens[(tokens < 0) | (tokens >= V)][0]
            raise EulerError(f"tokens: id {bad} is outside the vocabulary [0, {V})")
        if targets is not None:
            want = (self.cfg.n_mtp, *tokens.shape)
            if targets.shape != want:
                raise EulerError(f"targets: expected shape {want}, got {targets.shape}")
            if targets.size and (targets.min() < -1 or targets.max() >= V):
                raise EulerError(f"targets: ids must be -1 (none) or in [0, {V})")

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: np.ndarray,
        targets: np.ndarray | None = None,
        need_grad: bool = False,
        accumulate: bool = False,
        head_scale: np.ndarray | None = None,
    ) -> float | None:
        """Run the model on tokens (B, T); with targets (K, B, T) (-1 = none) return the loss.

        need_grad also computes the heads' gradients (fused) so that backward() can follow;
        accumulate adds this micro-batch's gradients to the ones already in the buffer.
        head_scale (K,) weighs each head's summed cross-entropy; default head_scales(targets).
        A data-parallel rank passes weights from the whole batch's target counts (see
        euler.training.distributed.shard_batch), so the mean over ranks is the whole batch's loss.
        """
        self.stage(tokens, targets, head_scale)
        return self.run(need_grad, accumulate)

    def stage(
        self,
        tokens: np.ndarray,
        targets: np.ndarray | None = None,
        head_scale: np.ndarray | None = None,
    ) -> None:
        """Check a batch and upload it (tokens, targets, head weights) into the arena.

        The first half of forward(): run() then computes on what is staged, with device work
        only, so that a CUDA graph can capture it (euler/graphs.py).
        """
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self._check_inputs(tokens, targets)
        B, T = tokens.shape
        a = self._arena(B, T)
        self.be.copy_(a.tokens, tokens.reshape(-1))
        self._scales = None
        if targets is not None:
            scales = head_scales(targets) if head_scale is None else head_scale
            K = self.cfg.n_mtp
            self.be.copy_(a.targets, np.ascontiguousarray(targets, dtype=np.int32).reshape(K, -1))
            self._scales = self.be.stage_scalars("head_scale", scales)

    def run(self, need_grad: bool = False, accumulate: bool = False):
        """The forward on the staged batch; the loss (with targets staged), else None.

        On the GPU the loss is a DeviceScalar: float() waits for it.
        """
        self._tokens = self.acts.tokens
        self.layers(self.acts)
        if self._scales is None:
            return None
        return self._heads(need_grad, accumulate)

    def layers(self, a: Activations, cache: KVCache | None = None) -> None:
        """The forward of a's staged tokens through every layer and the final norm, into
        a.xf (N, D): device work only (a CUDA graph can capture it).

        Without a cache, a's rows are B sequences of T tokens at positions 0..T-1 (training,
        evaluation); with one, B = 1 and row r is a token of sequence cache.slots[r] at
        cache.positions[r], whose key and value the attention caches (decoding: a prompt's
        prefill and one-token steps alike).
        """
        cfg, be, p, wt = self.cfg, self.be, self.p, self.w
        H, G, E, eps = cfg.n_head, cfg.n_kv_head, cfg.head_size, cfg.norm_eps
        B, T = a.B, a.T
        cos, sin = (self.cos, self.sin) if cache is None else (cache.cos, cache.sin)
        be.embedding_forward(a.x[0], a.tokens, p["tok_emb"])
        for layer in range(cfg.n_layer):
            w = f"layers.{layer}."
            qkv, att = a.qkv[layer], a.att[layer]  # (N, (H + 2G) E), (N, H E)
            # attention block: x + att(rmsnorm(x)) Wo^T
            be.rmsnorm_forward(a.xn1[layer], a.rstd1[layer], a.x[layer], p[w + "attn_norm"], eps)
            self._linear(qkv, a.xn1[layer], wt[w + "attn.wqkv"], cache)
            be.rope_forward(_3d(qkv, B, T), cos, sin, H, G, E)
            if cache is None:
                be.attention_forward(_3d(att, B, T), a.lse[layer], _3d(qkv, B, T), H, G, E)
            else:
                be.decode_attention(att, qkv, cache.k[layer], cache.v[layer], cache.slots,
                                    cache.positions, H, G, E)  # fmt: skip
            self._linear(a.xmid[layer], att, wt[w + "attn.wo"], cache, res=a.x[layer])
            # MLP block: xmid + swiglu(rmsnorm(xmid) Wgu^T) Wdown^T
            be.rmsnorm_forward(a.xn2[layer], a.rstd2[layer], a.xmid[layer], p[w + "mlp_norm"], eps)
            self._linear(a.gu[layer], a.xn2[layer], wt[w + "mlp.w_gateup"], cache)
            be.swiglu_forward(a.h[layer], a.gu[layer])
            self._linear(a.x[layer + 1], a.h[layer], wt[w + "mlp.w_down"], cache,
                         res=a.xmid[layer])  # fmt: skip
        be.rmsnorm_forward(a.xf, a.rstdf, a.x[cfg.n_layer], p["final_norm"], eps)

    def _linear(self, out, x, w, cache: KVCache | None, res=None) -> None:
        """out (N, M) = x (N, D) @ w (M, D)^T, plus res (N, M) where given (out may not
        overlap res). Without a cache, the backend's fastest product for the batch (with
        res, one fused call where the GPU has one); with a cache, decode_linear: each row's
        product alone, so a row's bits do not depend on the rows beside it and batched and
        speculative decoding give the tokens of decoding alone."""
        be = self.be
        if cache is None:
            if res is None:
                be.matmul(out, x, w, trans_b=True)
            else:
                be.matmul_residual(out, res, x, w)
            return
        be.decode_linear(out, x, w)
        if res is not None:
            be.residual_forward(out, res, out)

    def _heads(self, need_grad: bool, accumulate: bool):
        """Loss over the K heads; with need_grad, also dW_heads and dxf (fused backward)."""
        be, a = self.be, self.acts
        xf = a.xf
        for k in range(self.cfg.n_mtp):
            tk = a.targets[k]
            w = self.heads_w[k]  # (V, D)
            be.matmul(a.logits, xf, w, trans_b=True)  # (B T, V)
            if not need_grad:
                be.cross_entropy_forward(a.losses[k], a.logits, tk)
                continue
            be.cross_entropy_forward_backward(a.losses[k], a.logits, tk, self._scales, k)
            be.matmul_pair(
                Product(a.dxf, a.logits, w, accumulate=k > 0),
                Product(self.heads_g[k], a.logits, xf, trans_a=True, accumulate=accumulate),
            )
            be.wait_deferred()  # the next head's logits overwrite these
        self._accumulate = accumulate
        return be.loss_value(a.losses, self._scales)

    def head_logits(self, k: int = 0) -> np.ndarray:
        """Logits (B, T, V) of head k for the last forward's input, as a host array."""
        a = self.acts
        self.be.matmul(a.logits, a.xf, self.heads_w[k], trans_b=True)
        return host_values(self.be.to_host(a.logits)).reshape(a.B, a.T, -1).copy()

    # ------------------------------------------------------------------ backward
    def backward(self) -> None:
        """Gradients of the last forward(need_grad=True)'s loss, into self.grads (= or +=).

        Tied embeddings: g["tok_emb"] = (or +=) head 0's weight gradient (from the fused
        heads) + the embedding's scatter of dx.
        """
        cfg, be, a, p, g, wt = self.cfg, self.be, self.acts, self.p, self.g, self.w
        acc = self._accumulate
        H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
        B, T = a.B, a.T
        dx, dxn = a.dx, a.dxn
        be.rmsnorm_backward(
            dx, g["final_norm"], a.dxf, a.zero_bt_d, a.x[cfg.n_layer], p["final_norm"], a.rstdf,
            accumulate=acc,
        )  # fmt: skip
        # A pair's second product, a weight gradient, may run beside what follows (the GPU's
        # side stream) until a wait_deferred; keep=1 lets the newest go on. Each norm's
        # backward overwrites dx after a wait for the products that read it, and the next
        # layer's dgu and dqkv are overwritten only after waits that cover their readers.
        for layer in reversed(range(cfg.n_layer)):
            w = f"layers.{layer}."
            # MLP block, dx is d(loss)/d(x[layer + 1])
            be.matmul_pair(
                Product(a.dh, dx, wt[w + "mlp.w_down"]),
                Product(g[w + "mlp.w_down"], dx, a.h[layer], trans_a=True, accumulate=acc),
            )
            be.swiglu_backward(a.dgu, a.dh, a.gu[layer])
            be.matmul_pair(
                Product(dxn, a.dgu, wt[w + "mlp.w_gateup"]),
                Product(g[w + "mlp.w_gateup"], a.dgu, a.xn2[layer], trans_a=True, accumulate=acc),
            )
            be.wait_deferred(keep=1)  # dW_down has read dx, which the norm overwrites next
            be.rmsnorm_backward(
                dx, g[w + "mlp_norm"], dxn, dx, a.xmid[layer], p[w + "mlp_norm"],
                a.rstd2[layer], accumulate=acc,
            )  # fmt: skip
            # attention block, dx is now d(loss)/d(xmid[layer])
            be.matmul_pair(
                Product(_2d(a.datt), dx, wt[w + "attn.wo"]),
                Product(g[w + "attn.wo"], dx, a.att[layer], trans_a=True, accumulate=acc),
            )
            be.attention_backward(a.dqkv, a.datt, _3d(a.qkv[layer], B, T),
                                  _3d(a.att[layer], B, T), a.lse[layer], H, G, E)  # fmt: skip
            dqkv = a.dqkv_lp  # a.dqkv itself, rotated in place, unless bf16
            be.rope_backward(a.dqkv, self.cos, self.sin, H, G, E,
                             out=None if dqkv is a.dqkv else dqkv)  # fmt: skip
            be.matmul_pair(
                Product(dxn, _2d(dqkv), wt[w + "attn.wqkv"]),
                Product(g[w + "attn.wqkv"], _2d(dqkv), a.xn1[layer], trans_a=True, accumulate=acc),
            )
            be.wait_deferred(keep=1)  # dW_o has read dx (and dW_gateup dgu), as above
            be.rmsnorm_backward(
                dx, g[w + "attn_norm"], dxn, dx, a.x[layer], p[w + "attn_norm"],
                a.rstd1[layer], accumulate=acc,
            )  # fmt: skip
        # tied: head 0's weight gradient is already in g["tok_emb"] (written by _heads), so
        # the embedding's scatter adds to it
        be.embedding_backward(g["tok_emb"], dx, self._tokens,
                              accumulate=acc or cfg.tie_embeddings)  # fmt: skip
        be.wait_deferred()
