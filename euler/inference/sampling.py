"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from euler.errors import EulerError
from euler.schema import check_number


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95

    def __post_init__(self) -> None:
        check_number(self.temperature, "--temperature", lo=0.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise EulerError(f"--top-k must be an integer at least 0, got {self.top_k!r}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise EulerError(f"--top-p must be a number in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: np.ndarray, sc: SamplingConfig, rng: np.random.Generator) -> int:
    """One token id from logits (V,): argmax if greedy, else a draw from the filtered softmax.

    Filters apply in the order top-k, then top-p over what is left (the smallest set of
    most likely tokens whose probability reaches top_p; the most likely token always stays).
    """
    check_logits(logits)
    if sc.greedy:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / sc.temperature
    order = np.argsort(-z, kind="stable")
    if sc.top_k:
        order = order[: sc.top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if sc.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), sc.top_p)) + 1
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    # rng.choice(len(p), p=p) draws exactly this (one uniform against the normalised cdf),
    # after checking p at a cost of about half the call: p is a distribution by construction
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return int(order[np.searchsorted(cdf, rng.random(), side="right")])


def check_logits(logits: np.ndarray) -> np.ndarray:
    """logits, refused in one line if any is NaN or infinite (no token can be chosen from
    them: the weights are broken or the activations overflowed)."""
    if not np.isfinite(logits).all():
        bad = "NaN" if np.isnan(logits).any() else "infinite values"
        raise EulerError(
            f"the model's logits hold {bad}: its weights are broken or its activations "
            "overflowed, so no token can be chosen"
        )
    return logits


def greedy(logits: np.ndarray) -> np.ndarray | int:
    """The argmax over the last axis of finite logits: a token id, or one per row."""
    choice = np.argmax(check_logits(logits), axis=-1)
    return int(choice) if choice.ndim == 0 else choice
