"""The SFT data policy: which records a C-token context keeps, how, and how they are packed.

A record is prompt (P tokens, ending with <|assistant|>) + response + <|end|>. A window
holds C + 1 tokens: its positions 1..C are head 0's targets, so a record of at most C + 1
tokens fits whole, its <|end|> a target. Records are classified by `classify`:

- whole: it fits (and its response holds at most `max_answer` tokens, when given).
- cut (`long="cut"`, the default): the response is cut at its last sentence or line end
  that leaves room for <|end|>, which then closes it: the model sees an answer that ends.
  A record whose prompt leaves no room for one complete sentence is dropped.
- truncated (`long="truncate"`): cut to its first C + 1 tokens, with no <|end|>.
- dropped: `long="drop"`, or a prompt that alone fills the window.

`pack_windows` then places the kept records in windows: with packing, several whole
records share one window (first fit, longest first, so windows fill up; the records of a
window in a seeded random order). Attention crosses the records of a window, as
pretraining's attention crosses documents: a record sees earlier, unrelated records, as a
chat turn sees earlier turns. No target crosses: the target of position t counts only when
t and the target's position belong to the same record (SFTDataset's segments), and the
prompt's tokens are never targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import regex

from euler.errors import EulerError

if TYPE_CHECKING:
    from collections.abc import Callable

LONG_RULES = ("cut", "truncate", "drop")


def check_long(long: str) -> str:
    """long, if it names one of LONG_RULES; else EulerError naming the flag."""
    if long not in LONG_RULES:
        raise EulerError(f"--long must be one of {', '.join(LONG_RULES)}, got {long!r}")
    return long


# after . ! ? (not a list number's "1.") and any closing quotes or brackets, before space or
# the end; or the end of a line that does not announce more (":" or ",").
SENTENCE_END = regex.compile(r"(?<=[^\d\s][.!?][\"'\)\]\u201d\u2019]*)(?=\s|$)|(?<=[^\s:,])(?=\n)")


def sentence_ends(text: str) -> list[int]:
    """Character positions where `text` may be cut after a complete sentence or line, rising."""
    return [m.start() for m in SENTENCE_END.finditer(text) if m.start() > 0]


def cut_response(text: str, room: int, encode: Callable[[str], np.ndarray]) -> np.ndarray | None:
    """Ids of the longest prefix of `text` that ends a sentence or line and encodes to at
    most `room` tokens; None when not even the first sentence fits."""
    ends = sentence_ends(text)
    lo, hi, best = 0, len(ends) - 1, None
    while lo <= hi:  # token counts rise with the prefix: binary search
        mid = (lo + hi) // 2
        ids = encode(text[: ends[mid]])
        if len(ids) <= room:
            best, lo = ids, mid + 1
        else:
            hi = mid - 1
    return best


def classify(
    prompt: np.ndarray,
    response: np.ndarray,
    response_text: str,
    context: int,
    long: str,
    encode: Callable[[str], np.ndarray],
    end_id: int,
    max_answer: int,
) -> tuple[str, np.ndarray | None, np.ndarray | None]:
    """(kind, ids, mask) of one record for windows of context + 1 tokens.

    prompt (P,) int32 ends with <|assistant|>; response (R,) int32 ends with <|end|>; the
    response may hold at most what the window leaves after the prompt and, if max_answer >
    0, at most max_answer tokens (its <|end|> included); long is one of LONG_RULES (checked
    by check_long, once, by the caller). kind is "whole", "cut",
    "truncated" or "dropped" (then ids and mask are None).
    """
    room = context + 1 - len(prompt)
    if max_answer > 0:
        room = min(room, max_answer)
    if room <= 0:
        return "dropped", None, None
    if len(response) <= room:
        kind = "whole"
    elif long == "drop":
        return "dropped", None, None
    elif long == "truncate":
        kind, response = "truncated", response[:room]
    else:
        cut = cut_response(response_text, room - 1, encode)
        if cut is None:
            return "dropped", None, None
        kind, response = "cut", np.concatenate([cut, [end_id]]).astype(np.int32)
    ids = np.concatenate([prompt, response]).astype(np.int32)
    mask = np.concatenate([np.zeros(len(prompt), np.uint8), np.ones(len(response), np.uint8)])
    return kind, ids, mask


def pack_windows(lengths: np.ndarray, capacity: int, pack: bool, seed: int) -> list[list[int]]:
    """Record indices of each window: first fit, longest first, at most `capacity` tokens a
    window (with pack); one record a window otherwise. Windows and the records inside
    each come in an order drawn from `seed`."""
    rng = np.random.default_rng([seed, 0x5F7])
    if not pack:
        return [[int(i)] for i in rng.permutation(len(lengths))]
    if len(lengths) and int(np.max(lengths)) > capacity:
        raise EulerError(f"a record of {int(np.max(lengths))} tokens exceeds {capacity}")
    free = np.zeros(0, dtype=np.int64)
    windows: list[list[int]] = []
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        n = int(lengths[i])
        fits = np.flatnonzero(free >= n)
        if fits.size:
            w = int(fits[0])
        else:
            w = len(windows)
            windows.append([])
            free = np.append(free, capacity)
        windows[w].append(int(i))
        free[w] -= n
    return [
        [windows[w][j] for j in rng.permutation(len(windows[w]))]
        for w in rng.permutation(len(windows))
    ]
