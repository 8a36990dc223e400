"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from euler.errors import EulerError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise EulerError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EulerError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise EulerError(f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: np.ndarray, sc: SamplingConfig, rng: np.random.Generator) -> int:
    """One token id from logits (V,): argmax if greedy, else a draw from the filtered softmax.

    Filters apply in the order top-k, then top-p over what is left (the smallest set of
    most likely tokens whose probability reaches top_p; the most likely token always stays).
    """
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
    return int(order[rng.choice(len(order), p=p)])
