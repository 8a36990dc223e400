"""ROUGE-L of `euler eval --instructions --json` results side by side: full, at equal length,
and against references cut to the answer's budget.

    python bench/answer_overlap.py BASE.json OTHER.json... [--json rows.json]

For each file: the share of answers that end, the share that loop (euler eval's count: a
word 4-gram three times), mean words, and ROUGE-L precision, recall and F1 against the
references. Then two scores that do not reward an answer for running on:

- "F1 at BASE's length": each answer cut, record by record, to as many words as BASE's
  answer to the same instruction. ROUGE-L F1 against references of a few hundred words
  grows with the answer's length, so a policy whose answers stop scores below one whose
  answers run to the token limit even when its words are as good; at equal length the
  better words win.
- "F1 budget": euler eval's rouge_l_budget, each answer against its reference's first
  --max-tokens tokens, so that a reference holds no more than an answer may say.

F1 is also given apart for the answers that loop and those that do not.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from rouge_score import rouge_scorer


def first_words(text: str, n: int) -> str:
    """The first n whitespace-separated words of text, joined by single spaces."""
    return " ".join(text.split()[:n])


def overlap_rows(paths: list[str]) -> list[dict]:
    """One dict of scores a file, in order; the first file is BASE."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    runs = {p: json.load(open(p, encoding="utf-8"))["instructions"]["answers"] for p in paths}
    base = runs[paths[0]]
    rows = []
    for path, answers in runs.items():
        if [a["instruction"] for a in answers] != [a["instruction"] for a in base]:
            sys.exit(f"error: {path}: not the same instructions as {paths[0]}")
        missing = {"loops", "rouge_l_budget"} - set().union(*answers)
        if missing:
            sys.exit(f"error: {path}: answers lack {', '.join(sorted(missing))} "
                     "(written by an older euler eval: run it again)")  # fmt: skip
        full = [scorer.score(a["reference"], a["answer"])["rougeL"] for a in answers]
        cut = [
            scorer.score(a["reference"], first_words(a["answer"], len(b["answer"].split())))
            for a, b in zip(answers, base, strict=True)
        ]
        loops = np.array([a["loops"] for a in answers], bool)
        f1 = np.array([s.fmeasure for s in full])
        rows.append({
            "file": path,
            "ended": float(np.mean([a["ended"] for a in answers])),
            "loops": float(loops.mean()),
            "words": float(np.mean([len(a["answer"].split()) for a in answers])),
            "precision": float(np.mean([s.precision for s in full])),
            "recall": float(np.mean([s.recall for s in full])),
            "f1": float(f1.mean()),
            "f1_at_base_length": float(np.mean([s["rougeL"].fmeasure for s in cut])),
            "f1_reference_budget": float(np.mean([a["rouge_l_budget"] for a in answers])),
            "f1_looping": float(f1[loops].mean()) if loops.any() else None,
            "f1_not_looping": float(f1[~loops].mean()) if (~loops).any() else None,
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="euler eval --instructions --json files, BASE first")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if len(args.files) < 2:
        sys.exit("error: give BASE.json and at least one OTHER.json")
    rows = overlap_rows(args.files)
    print(f"{'file':40} ended  loops  words  prec.  recall     F1  F1@BASE  F1 budget  "
          "F1 loop / not")  # fmt: skip
    for r in rows:
        split = " / ".join("  -   " if v is None else f"{v:.4f}"
                           for v in (r["f1_looping"], r["f1_not_looping"]))  # fmt: skip
        print(
            f"{r['file'][-40:]:40} {r['ended']:5.1%} {r['loops']:6.1%} {r['words']:6.1f} "
            f"{r['precision']:6.3f} {r['recall']:7.4f} {r['f1']:6.4f} "
            f"{r['f1_at_base_length']:8.4f} {r['f1_reference_budget']:10.4f}  {split}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
