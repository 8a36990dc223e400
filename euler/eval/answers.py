"""Scores of one answer against its reference: a repeated n-gram loop and ROUGE-L.

Words are what ROUGE's own tokenizer makes of a text (lowercased runs of letters and
digits), so both scores do not depend on the model's tokenizer.
"""

from __future__ import annotations

import functools
from collections import Counter

from rouge_score import rouge_scorer, tokenize

LOOP_N, LOOP_TIMES = 4, 3  # a loop: one word 4-gram occurring three times or more


def words(text: str) -> list[str]:
    """The lowercased alphanumeric words of text, as ROUGE tokenizes it (no stemming)."""
    return tokenize.tokenize(text, None)


def has_loop(text: str, n: int = LOOP_N, times: int = LOOP_TIMES) -> bool:
    """True when some n consecutive words occur `times` times or more in text."""
    w = words(text)
    counts = Counter(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    return max(counts.values(), default=0) >= times


@functools.cache
def _scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(answer: str, reference: str) -> float:
    """ROUGE-L F1 of answer against reference (Porter-stemmed words), in [0, 1]."""
    return float(_scorer().score(reference, answer)["rougeL"].fmeasure)
