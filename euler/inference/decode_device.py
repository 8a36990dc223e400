"""Decoding on any backend, the GPU's included, by recomputing the whole context per call.

The KV-cache decoders compute in float32; under --precision bf16 (on the GPU) `euler chat`
decodes through this one instead, and any backend could. A forward of the full context of
the `gpu` preset costs milliseconds on an H200, so it feeds tokens by running the training
forward over positions 0..context-1 each time. Positions
after the fed ones hold padding (token 0), which causal attention keeps from reaching the
earlier rows, and the shapes are the same on every call, so a position's hidden row does
not depend on how the tokens were split into calls: speculative decoding stays exactly
greedy. Under --precision bf16 the forward runs in bf16 (euler.precision) and the heads'
logits are taken on the host from the bf16 final hidden rows and bf16-rounded heads, the
values the GPU's head product reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from euler.backend import Backend
from euler.inference.batch import check_feed
from euler.inference.generate import Decoder
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights
from euler.model.transformer import Model
from euler.precision import host_values, round_bf16


class RecomputeDecoder:
    """The Decoder interface (feed, logits, truncate, length) over a Model on any backend."""

    def __init__(
        self, cfg: ModelConfig, params: np.ndarray, backend: Backend, precision: str = "fp32"
    ):
        self.cfg = cfg
        params = np.asarray(params, np.float32)
        self.model = Model(cfg, backend, flat_params=params, precision=precision, train=False)
        heads = head_weights(cfg, ParamLayout(cfg).views(params))  # K of (V, D)
        self.heads = [round_bf16(h) for h in heads] if precision == "bf16" else heads
        self.tokens = np.zeros((1, cfg.context), np.int32)
        self.length = 0

    def truncate(self, length: int) -> None:
        """Forget positions >= length."""
        self.length = min(self.length, length)

    def feed(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Append n tokens at positions length..length+n-1; return their final hidden (n, D)."""
        tokens = check_feed(self.cfg, tokens, self.length)
        pos0, n = self.length, len(tokens)
        self.tokens[0, pos0 : pos0 + n] = tokens
        self.tokens[0, pos0 + n :] = 0
        self.model.forward(self.tokens)
        xf = host_values(self.model.be.to_host(self.model.acts.xf))  # (context, D): B = 1
        self.length = pos0 + n
        return np.ascontiguousarray(xf[pos0 : pos0 + n])

    def logits(self, xf: np.ndarray, k: int = 0) -> np.ndarray:
        """Head k's logits (n, V) for hidden rows xf (n, D), on the host."""
        return np.atleast_2d(xf) @ self.heads[k].T


def make_decoder(
    cfg: ModelConfig, params: np.ndarray, backend: Backend, precision: str = "fp32",
    threads: int = 1,
) -> Decoder | RecomputeDecoder:  # fmt: skip
    """A decoder of flat params (P,) on backend: the KV-cache Decoder (float32, its CPU
    kernels on `threads` threads) where the backend has one (kv_cache) and precision is not
    bf16, else a RecomputeDecoder in `precision` (bf16 decoding runs the training forward in
    bf16)."""
    if backend.kv_cache and precision != "bf16":
        return Decoder(cfg, params, backend=backend, threads=threads)
    return RecomputeDecoder(cfg, params, backend, precision)
