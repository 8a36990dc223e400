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

A feed of at most GRAPH_ROWS rows runs in device buffers kept for its row count, so that on
a backend that captures (the GPU's) its forward and the heads' product replay as CUDA
graphs (euler.training.step_graph.StepGraphs, keyed by the row count): a decoding step of
the `gpu` preset is some 150 kernels, each 40-60 us of Python to launch one by one. The
rows' tokens, slots, positions and RoPE rows are uploaded into those buffers before the
replay; the kernels read positions from the device, so one graph serves every step.

A forward's CPU kernels run on `threads` Numba threads (1 by default, set for the calling
thread during each call and restored after): a decoding step is a few dozen kernels of
microseconds each, and waking the other cores' threads for each costs more than they
save. Measured on the 2-core machine, idle, `small`: 2,527 tokens/s at batch 1 on one
thread against 234 on two, and 8,748 against 6,909 at batch 32.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numba
import numpy as np

from euler.backend import Backend
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights
from euler.model.transformer import rope_tables
from euler.training.step_graph import StepGraphs

GRAPH_ROWS = 64  # feeds of at most this many rows keep their buffers and replay graphs


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


@dataclass
class _Rows:
    """Device buffers of one feed of n rows: its inputs (uploaded before each forward)
    and activations."""

    tokens: object  # (n,) int32
    slot: object  # (n,) int32
    pos: object  # (n,) int32
    cos: object  # (n, E / 2): RoPE rows at the rows' positions
    sin: object
    x: object  # (n, D): the residual stream
    xn: object  # (n, D)
    tmp: object  # (n, D)
    rstd: object  # (n,)
    qkv: object  # (n, (H + 2G) E)
    att: object  # (n, H E)
    gu: object  # (n, 2F)
    h: object  # (n, F)
    xf: object  # (n, D): the final hidden rows


class BatchDecoder:
    """Inference forward with a KV cache of `slots` sequences of up to `cfg.context`
    positions each, on a backend that has one (kv_cache; default the CPU's). feed and
    logits take and return host arrays. cuda_graph: replay feeds of at most GRAPH_ROWS
    rows as CUDA graphs where the backend can capture (False: launch every kernel)."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: np.ndarray,
        slots: int = 1,
        dtype=np.float32,
        backend: Backend | None = None,
        threads: int = 1,
        cuda_graph: bool = True,
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
        self.heads = head_weights(cfg, self.p)  # K matrices (V, D); head 0 tok_emb if tied
        # host tables: each call gathers its rows' positions from them
        self.cos, self.sin = rope_tables(cfg, self.dtype)
        L, G, C, E = cfg.n_layer, cfg.n_kv_head, cfg.context, cfg.head_size
        self.k_cache = backend.zeros((L, slots, G, C, E), self.dtype)  # keys after RoPE
        self.v_cache = backend.zeros((L, slots, G, C, E), self.dtype)
        self.lengths = [0] * slots  # slot s caches its positions 0..lengths[s]-1
        self.graphs = StepGraphs(backend, cuda_graph, log=lambda m: print(m, file=sys.stderr))
        self._rows: dict[int, _Rows] = {}  # feeds of n <= GRAPH_ROWS rows: their buffers
        self._heads: dict[int, tuple] = {}  # n: the heads' (input (n, D), logits (n, V))

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
        cfg = self.cfg
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
        rows = self._rows.get(n) or self._new_rows(n)
        if n <= GRAPH_ROWS:
            self._rows[n] = rows
        for dst, src in (
            (rows.tokens, tokens),
            (rows.slot, row_slot),
            (rows.pos, row_pos),
            (rows.cos, self.cos[row_pos]),
            (rows.sin, self.sin[row_pos]),
        ):
            self.be.copy_(dst, np.ascontiguousarray(src))  # fmt: skip
        if n <= GRAPH_ROWS:
            self.graphs.run(("feed", n), partial(self._forward, rows))
        else:
            self._forward(rows)
        for s, t in zip(slots, parts, strict=True):
            self.lengths[s] += len(t)
        xf = np.array(self.be.to_host(rows.xf))  # a copy: the next feed refills the buffer
        ends = np.cumsum([len(t) for t in parts])
        return [xf[e - len(t) : e] for e, t in zip(ends, parts, strict=True)]

    def _new_rows(self, n: int) -> _Rows:
        """Zeroed device buffers for a feed of n rows."""
        cfg = self.cfg
        D, F, half = cfg.d_model, cfg.ffn_hidden, self.cos.shape[1]
        z = lambda *shape: self.be.zeros(shape, self.dtype)  # noqa: E731
        i = lambda: self.be.zeros((n,), np.int32)  # noqa: E731
        return _Rows(i(), i(), i(), z(n, half), z(n, half), z(n, D), z(n, D), z(n, D), z(n),
                     z(n, cfg.qkv_dim), z(n, cfg.q_dim), z(n, 2 * F), z(n, F), z(n, D))  # fmt: skip

    def _forward(self, r: _Rows) -> None:
        """The forward of r's uploaded rows into r.xf, caching their keys and values: device
        work only (a CUDA graph can capture it)."""
        cfg, be, p = self.cfg, self.be, self.p
        n = r.x.shape[0]
        H, G, E = cfg.n_head, cfg.n_kv_head, cfg.head_size
        be.embedding_forward(r.x, r.tokens, p["tok_emb"])
        for layer in range(cfg.n_layer):
            w = f"layers.{layer}."
            be.rmsnorm_forward(r.xn, r.rstd, r.x, p[w + "attn_norm"], cfg.norm_eps)
            be.decode_linear(r.qkv, r.xn, p[w + "attn.wqkv"])
            be.rope_forward(r.qkv.reshape(1, n, cfg.qkv_dim), r.cos, r.sin, H, G, E, 0)
            be.decode_attention(r.att, r.qkv, self.k_cache[layer], self.v_cache[layer], r.slot,
                                r.pos, H, G, E)  # fmt: skip
            be.decode_linear(r.tmp, r.att, p[w + "attn.wo"])
            be.residual_forward(r.x, r.x, r.tmp)
            be.rmsnorm_forward(r.xn, r.rstd, r.x, p[w + "mlp_norm"], cfg.norm_eps)
            be.decode_linear(r.gu, r.xn, p[w + "mlp.w_gateup"])
            be.swiglu_forward(r.h, r.gu)
            be.decode_linear(r.tmp, r.h, p[w + "mlp.w_down"])
            be.residual_forward(r.x, r.x, r.tmp)
        be.rmsnorm_forward(r.xf, r.rstd, r.x, p["final_norm"], cfg.norm_eps)

    def logits(self, xf: np.ndarray, k: int = 0) -> np.ndarray:
        """Head k's logits (n, V) for hidden rows xf (n, D); head k predicts token t+1+k."""
        xf = np.ascontiguousarray(np.atleast_2d(xf), dtype=self.dtype)
        n = xf.shape[0]
        bufs = self._heads.get(n)
        if bufs is None:
            bufs = (self.be.zeros(xf.shape, self.dtype),
                    self.be.zeros((n, self.cfg.vocab_size), self.dtype))  # fmt: skip
            if n <= GRAPH_ROWS:
                self._heads[n] = bufs
        x, out = bufs
        self.be.copy_(x, xf)
        product = partial(self.be.decode_linear, out, x, self.heads[k])
        with self._threads():
            if n <= GRAPH_ROWS:
                self.graphs.run(("logits", n, k), product)
            else:
                product()
        return np.array(self.be.to_host(out))
