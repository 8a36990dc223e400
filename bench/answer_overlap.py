"""ROUGE-L of `euler eval --instructions --json` results side by side, and at equal length.

    python bench/answer_overlap.py BASE.json OTHER.json...

For each file: the share of answers that end, mean words, and ROUGE-L precision, recall
and F1 against the references. Then each OTHER's answers cut, record by record, to as
many words as BASE's answer to the same instruction, scored again: at equal length, which
answers follow their references better? (ROUGE-L F1 against references of a few hundred
words grows with the answer's length, so a policy whose answers stop scores below one
whose answers run to the token limit even when its words are as good.)
"""

from __future__ import annotations

import json
import sys

import numpy as np
from rouge_score import rouge_scorer


def main(paths: list[str]) -> None:
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    runs = {p: json.load(open(p, encoding="utf-8"))["instructions"]["answers"] for p in paths}
    base = runs[paths[0]]
    print(f"{'file':48} ended  words  precision  recall      F1   F1 at BASE's length")
    for path, answers in runs.items():
        if [a["instruction"] for a in answers] != [a["instruction"] for a in base]:
            sys.exit(f"error: {path}: not the same instructions as {paths[0]}")
        full = [scorer.score(a["reference"], a["answer"])["rougeL"] for a in answers]
        cut = [
            scorer.score(a["reference"], " ".join(a["answer"].split()[: len(b["answer"].split())]))
            for a, b in zip(answers, base, strict=True)
        ]
        print(
            f"{path[-48:]:48} {np.mean([a['ended'] for a in answers]):5.1%} "
            f"{np.mean([len(a['answer'].split()) for a in answers]):6.1f} "
            f"{np.mean([s.precision for s in full]):10.3f} "
            f"{np.mean([s.recall for s in full]):7.4f} "
            f"{np.mean([s.fmeasure for s in full]):7.4f} "
            f"{np.mean([s['rougeL'].fmeasure for s in cut]):12.4f}"
        )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])
