"""The KV-cache forward of several sequences at once: the rows of one call may belong to any
of S sequences (cache slots), each at its own length.

BatchDecoder.feed takes, per sequence fed, its slot and its new tokens (a whole prompt, or
one token a decoding step) and runs one forward over all their rows together: the matrix
products read each weight once for the whole batch, and the per-call overhead of the
forward's few dozen kernel launches is paid once instead of once per sequence.

The forward is the training forward, Model.layers, given a KVCache: the same layer
schedule, with the backend's decode_linear and decode_attention where the rows must be
computed alone. Every step then treats rows independently of the others, so a row's hidden
state is bit-identical whatever rows share its call: a sequence decoded in a batch gets
exactly the tokens it gets alone, and speculative decoding (several rows of one sequence)
exactly the greedy ones.

A feed of at most GRAPH_ROWS rows runs in device buffers kept for its row count, so that on
a backend that captures (the GPU's) its forward and the heads' product replay as CUDA
graphs (euler.graphs.StepGraphs, keyed by the row count): a decoding step of the `gpu`
preset is some 150 kernels, each 40-60 us of Python to launch one by one. The rows' tokens,
slots, positions and RoPE rows are uploaded into those buffers before the replay; the
kernels read positions from the device, so one graph serves every step.

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
from functools import partial

import numba
import numpy as np

from euler.backend import Backend, make_backend
from euler.errors import EulerError
from euler.graphs import StepGraphs
from euler.model.config import ModelConfig
from euler.model.transformer import Activations, KVCache, Model, rope_tables

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
            backend = make_backend("cpu")
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
        self.cfg, self.be, self.slots = cfg, backend, slots
        self.dtype = np.dtype(dtype)
        self.model = Model(cfg, backend, self.dtype, flat_params=params, train=False)
        # host tables: each call gathers its rows' positions from them
        self.cos, self.sin = rope_tables(cfg, self.dtype)
        L, G, C, E = cfg.n_layer, cfg.n_kv_head, cfg.context, cfg.head_size
        self.k_cache = backend.zeros((L, slots, G, C, E), self.dtype)  # keys after RoPE
        self.v_cache = backend.zeros((L, slots, G, C, E), self.dtype)
        self._k = [self.k_cache[layer] for layer in range(L)]  # views made once
        self._v = [self.v_cache[layer] for layer in range(L)]
        self.lengths = [0] * slots  # slot s caches its positions 0..lengths[s]-1
        self.graphs = StepGraphs(backend, cuda_graph, log=lambda m: print(m, file=sys.stderr))
        # feeds of n <= GRAPH_ROWS rows: their arena and cache rows
        self._rows: dict[int, tuple[Activations, KVCache]] = {}
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
        acts, cache = self._rows.get(n) or self._new_rows(n)
        if n <= GRAPH_ROWS:
            self._rows[n] = acts, cache
        for dst, src in (
            (acts.tokens, tokens),
            (cache.slots, row_slot),
            (cache.positions, row_pos),
            (cache.cos, self.cos[row_pos]),
            (cache.sin, self.sin[row_pos]),
        ):
            self.be.copy_(dst, np.ascontiguousarray(src))  # fmt: skip
        forward = partial(self.model.layers, acts, cache)
        if n <= GRAPH_ROWS:
            self.graphs.run(("feed", n), forward)
        else:
            forward()
        for s, t in zip(slots, parts, strict=True):
            self.lengths[s] += len(t)
        xf = np.array(self.be.to_host(acts.xf))  # a copy: the next feed refills the buffer
        ends = np.cumsum([len(t) for t in parts])
        return [xf[e - len(t) : e] for e, t in zip(ends, parts, strict=True)]

    def _new_rows(self, n: int) -> tuple[Activations, KVCache]:
        """Zeroed device buffers for a feed of n rows: the arena of a cached forward and
        the rows' places in the cache (slots, positions, RoPE rows)."""
        acts = Activations(self.cfg, self.be, self.dtype, 1, n, cached=True)
        z = lambda *shape: self.be.zeros(shape, self.dtype)  # noqa: E731
        i = lambda: self.be.zeros((n,), np.int32)  # noqa: E731
        half = self.cos.shape[1]
        return acts, KVCache(self._k, self._v, i(), i(), z(n, half), z(n, half))

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
        product = partial(self.be.decode_linear, out, x, self.model.heads_w[k])
        with self._threads():
            if n <= GRAPH_ROWS:
                self.graphs.run(("logits", n, k), product)
            else:
                product()
        return np.array(self.be.to_host(out))
