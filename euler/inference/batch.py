"""The KV-cache forward of several sequences at once: the rows of one call may belong to any
of S sequences (cache slots), each at its own length.

BatchDecoder.feed takes, per sequence fed, its slot and its new tokens (a whole prompt, or
one token a decoding step) and runs one forward over all their rows together: the matrix
products read each weight once for the whole batch, and the per-call overhead of the
forward's few dozen kernel launches is paid once instead of once per sequence.

Every step treats rows alone (embedding, RMSNorm, RoPE at the row's own position, SwiGLU,
the residual) and the backend's decode_linear and decode_attention compute each row
independently of the others, so a row's hidden state is bit-identical whatever rows share
its call: a sequence decoded in a batch gets exactly the tokens it gets alone, and
speculative decoding (several rows of one sequence) exactly the greedy ones.

A forward's CPU kernels run on `threads` Numba threads (1 by default, set for the calling
thread during each call and restored after): a decoding step is a few dozen kernels of
microseconds each, and waking the other cores' threads for each costs more than they
save. Measured on the 2-core machine, idle, `small`: 2,527 tokens/s at batch 1 on one
thread against 234 on two, and 8,748 against 6,909 at batch 32.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numba
import numpy as np

from euler.backend import Backend
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout
from euler.model.transformer import rope_tables


def check_feed(cfg: ModelConfig, tokens, pos0: int) -> np.ndarray:
    """tokens as int32 (n,), after checking they exist, fit after pos0 and are in the vocab."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    n = len(tokens)
    if n == 0:
        raise EulerError("feed: no tokens")
    if pos0 + n > cfg.context:
        raise EulerError(f"sequence length {pos0 + n} exceeds the context ({cfg.context})")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise EulerError(f"token ids must be in [0, {cfg.vocab_size})")
    return tokens


class BatchDecoder:
    """Inference forward with a KV cache of `slots` sequences of up to `cfg.context`
    positions each, on a backend that has one (kv_cache; default the CPU's). feed and
    logits take and return host arrays."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: np.ndarray,
        slots: int = 1,
        dtype=np.float32,
        backend: Backend | None = None,
        threads: int = 1,
    ):
        if backend is None:
            from euler.cpu.backend import CpuBackend

            backend = CpuBackend()
        if not backend.kv_cache:
            raise EulerError(
                f"the {backend.name} backend has no KV-cache kernels: decode with RecomputeDecoder"
            )
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise EulerError(f"slots must be an integer at least 1, got {slots!r}")
        if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
            raise EulerError(f"threads must be in [1, {numba.config.NUMBA_NUM_THREADS}], "
                             f"got {threads!r}")  # fmt: skip
        self.threads = threads
        layout = ParamLayout(cfg)
        if params.shape != (layout.size,):
            raise EulerError(f"parameters: expected {layout.size} values, got {params.size}")
        self.cfg, self.be, self.slots = cfg, backend, slots
        self.dtype = np.dtype(dtype)
        self.params = backend.to_device(np.ascontiguousarray(params, dtype=self.dtype))
        self.p = layout.views(self.params)
        # host tables: each call gathers its rows' positions from them
        self.cos, self.sin = rope_tables(cfg, self.dtype)
        L, G, C, E = cfg.n_layer, cfg.n_kv_head, cfg.context, cfg.head_size
        self.k_cache = backend.zeros((L, slots, G, C, E), self.dtype)  # keys after RoPE
        self.v_cache = backend.zeros((L, slots, G, C, E), self.dtype)
        self.lengths = [0] * slots  # slot s caches its positions 0..lengths[s]-1

    def truncate(self, slot: int, length: int) -> None:
        """Forget slot's cached positions >= length (a finished sequence: 0)."""
        self.lengths[slot] = min(self.lengths[slot], length)

    @contextmanager
    def _threads(self) -> Iterator[None]:
        """Numba's CPU kernels on self.threads threads in this block (thread-local)."""
        before = numba.get_num_threads()
        numba.set_num_threads(self.threads)
        try:
            yield
        finally:
            numba.set_num_threads(before)

    def feed(self, feeds: Sequence[tuple[int, Sequence[int] | np.ndarray]]) -> list[np.ndarray]:
        """One forward over every (slot, tokens) of feeds, each slot at most once: its tokens
        are appended at positions lengths[slot].. of that slot. Returns each feed's final
        hidden rows (n_i, D), in feeds' order."""
        with self._threads():
            return self._feed(feeds)

    def _feed(self, feeds) -> list[np.ndarray]:
        cfg, be, p = self.cfg, self.be, self.p
        if not feeds:
            raise EulerError("feed: no sequences")
        slots = [s for s, _ in feeds]
        if len(set(slots)) != len(slots) or min(slots) < 0 or max(slots) >= self.slots:
            raise EulerError(f"feed: slots must be distinct and in [0, {self.slots}), got {slots}")
        parts = [check_feed(cfg, t, self.lengths[s]) for s, t in feeds]
        tokens = np.concatenate(parts)
        starts = [self.lengths[s] for s in slots]
        row_slot = np.repeat(np.array(slots, np.int32), [len(t) for t in parts])
        row_pos = np.concatenate([np.arange(a, a + len(t), dtype=np.int32)
                                  for a, t in zip(starts, parts, strict=True)])  # fmt: skip
        n = len(tokens)
        H, G, E, D, F = cfg.n_head, cfg.n_kv_head, cfg.head_size, cfg.d_model, cfg.ffn_hidden
        z = lambda *shape: be.zeros(shape, self.dtype)  # noqa: E731
        x, xn, tmp, rstd = z(n, D), z(n, D), z(n, D), z(n)
        qkv, att, gu, h = z(n, cfg.qkv_dim), z(n, cfg.q_dim), z(n, 2 * F), z(n, F)
        # RoPE of row r at positions[r]: the tables' rows gathered, one per row
        cos, sin = (be.to_device(np.ascontiguousarray(a[row_pos])) for a in (self.cos, self.sin))
        dev_slot, dev_pos = be.to_device(row_slot), be.to_device(row_pos)
        be.embedding_forward(x, be.to_device(tokens), p["tok_emb"])
        for layer in range(cfg.n_layer):
            w = f"layers.{layer}."
            be.rmsnorm_forward(xn, rstd, x, p[w + "attn_norm"], cfg.norm_eps)
            be.decode_linear(qkv, xn, p[w + "attn.wqkv"])
            be.rope_forward(qkv.reshape(1, n, cfg.qkv_dim), cos, sin, H, G, E, 0)
            be.decode_attention(att, qkv, self.k_cache[layer], self.v_cache[layer], dev_slot,
                                dev_pos, H, G, E)  # fmt: skip
            be.decode_linear(tmp, att, p[w + "attn.wo"])
            be.residual_forward(x, x, tmp)
            be.rmsnorm_forward(xn, rstd, x, p[w + "mlp_norm"], cfg.norm_eps)
            be.decode_linear(gu, xn, p[w + "mlp.w_gateup"])
            be.swiglu_forward(h, gu)
            be.decode_linear(tmp, h, p[w + "mlp.w_down"])
            be.residual_forward(x, x, tmp)
        xf = z(n, D)
        be.rmsnorm_forward(xf, rstd, x, p["final_norm"], cfg.norm_eps)
        for s, t in zip(slots, parts, strict=True):
            self.lengths[s] += len(t)
        xf = be.to_host(xf)
        ends = np.cumsum([len(t) for t in parts])
        return [xf[e - len(t) : e] for e, t in zip(ends, parts, strict=True)]

    def logits(self, xf: np.ndarray, k: int = 0) -> np.ndarray:
        """Head k's logits (n, V) for hidden rows xf (n, D); head k predicts token t+1+k."""
        xf = self.be.to_device(np.ascontiguousarray(np.atleast_2d(xf), dtype=self.dtype))
        out = self.be.zeros((xf.shape[0], self.cfg.vocab_size), self.dtype)
        with self._threads():
            self.be.decode_linear(out, xf, self.p["mtp_heads"][k])
        return self.be.to_host(out)
