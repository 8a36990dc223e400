"""Greedy answers to instruction records, scored: does the model stop, loop, and say what
the reference says?

Each record is answered alone (a fresh conversation, the chat template, greedy decoding:
the same path as `euler chat --temperature 0`), up to max_tokens. An answer *ends* when
the model emits <|end|> (or <|endoftext|>) within max_tokens; it *loops* when some word
4-gram occurs three times in it (answers.has_loop); its overlap with the reference output
is ROUGE-L F1 over Porter-stemmed words (Google's rouge-score). The same loop test on the
references' first max_tokens tokens says how often real answers repeat themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from euler.data.chat_template import prompt_text
from euler.eval.answers import LOOP_N, LOOP_TIMES, has_loop, rouge_l
from euler.inference.generate import ChatSession
from euler.inference.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, top_k=0, top_p=1.0)


def answer_records(
    session: ChatSession,
    records: list[dict],
    max_tokens: int,
    on_record: Callable[[], None] | None = None,
) -> list[dict]:
    """One scored answer per record: {instruction, input, reference, answer, tokens, ended,
    loops, reference_loops, rouge_l, rouge_l_budget, prompt_cut}; on_record() after each
    (for a progress bar). rouge_l scores the answer against the whole reference,
    rouge_l_budget against the reference's first max_tokens tokens: what an answer may say."""
    rng = np.random.default_rng(0)  # greedy: never drawn from
    out = []
    for rec in records:
        session.reset()
        res, cut = session.reply(
            prompt_text(rec["instruction"], rec["input"]), max_tokens, GREEDY, rng
        )
        answer = session.tok.decode(res.tokens)
        reference = rec["output"].strip()
        head = session.tok.decode(session.tok.encode(reference)[:max_tokens])
        out.append(
            {
                "instruction": rec["instruction"],
                "input": rec["input"],
                "reference": reference,
                "answer": answer,
                "tokens": len(res.tokens),
                "ended": res.stop == "end",
                "loops": has_loop(answer),
                "reference_loops": has_loop(head),
                "rouge_l": rouge_l(answer, reference),
                "rouge_l_budget": rouge_l(answer, head),
                "prompt_cut": cut,
            }
        )
        if on_record:
            on_record()
    return out


def summarize(answers: list[dict], max_tokens: int, path: Path | str) -> dict:
    """The shares and means of a list of answer_records results."""
    n = len(answers)

    def mean(key: str) -> float:
        return float(np.mean([a[key] for a in answers])) if n else float("nan")

    return {
        "file": str(path),
        "records": n,
        "max_tokens": max_tokens,
        "ended_share": mean("ended"),
        "mean_tokens": mean("tokens"),
        "loop_share": mean("loops"),
        "loop_n": LOOP_N,
        "loop_times": LOOP_TIMES,
        "reference_loop_share": mean("reference_loops"),
        "rouge_l": mean("rouge_l"),
        "rouge_l_budget": mean("rouge_l_budget"),
        "prompts_cut": int(sum(a["prompt_cut"] for a in answers)),
    }
