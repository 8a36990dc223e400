"""GPT-2 pretokenization over UTF-8 bytes, compiled: the exact split of the GPT-2 regex.

The pattern below is the specification (the Hugging Face export and the tests use it);
`piece_end` is a hand-written matcher of the same alternatives, in the same order, that
runs on raw bytes so that training and encoding never build Python strings per piece.
Bytes that are not valid UTF-8 count as single "other" characters, which is exactly how
the pattern sees Python's `surrogateescape` decoding of them.
"""

from __future__ import annotations

import functools

import numpy as np
import regex
from numba import njit

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Character classes as the pattern sees them; a code point is in exactly one.
OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3


@functools.cache
def char_classes() -> np.ndarray:
    """uint8[0x110000]: the class (OTHER, LETTER, NUMBER, SPACE) of every code point.

    Derived from the `regex` module itself (\\p{L}, \\p{N}, \\s), so the compiled matcher
    agrees with GPT2_PATTERN by construction.
    """
    every = "".join(map(chr, range(0x110000)))
    table = np.zeros(0x110000, np.uint8)
    for cls, pat in ((LETTER, r"\p{L}+"), (NUMBER, r"\p{N}+"), (SPACE, r"\s+")):
        for m in regex.finditer(pat, every):
            if table[m.start() : m.end()].any():
                raise AssertionError(f"code points in two classes near U+{m.start():04X}")
            table[m.start() : m.end()] = cls
    return table


@njit(cache=True)
def decode_utf8(b0, b1, b2, b3):
    """(code point, byte length) of the character whose bytes start b0 b1 b2 b3 (pass 0
    past the end); (-1, 1) when b0 does not start a valid character.

    Strict UTF-8 (Unicode table 3-7): overlongs, surrogates and values past U+10FFFF are
    invalid, so each of their bytes stands alone, as with Python's decoder. Scalars only:
    array arguments would cost reference counting on every call.
    """
    b0, b1, b2, b3 = np.int64(b0), np.int64(b1), np.int64(b2), np.int64(b3)
    if b0 < 0x80:
        return b0, 1
    c1 = 0x80 <= b1 <= 0xBF
    if 0xC2 <= b0 <= 0xDF and c1:
        return ((b0 & 0x1F) << 6) | (b1 & 0x3F), 2
    c2 = 0x80 <= b2 <= 0xBF
    if 0xE0 <= b0 <= 0xEF and c1 and c2:
        if (b0 != 0xE0 or b1 >= 0xA0) and (b0 != 0xED or b1 <= 0x9F):
            return ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F), 3
    if 0xF0 <= b0 <= 0xF4 and c1 and c2 and 0x80 <= b3 <= 0xBF:
        if (b0 != 0xF0 or b1 >= 0x90) and (b0 != 0xF4 or b1 <= 0x8F):
            cp = ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F)
            return cp, 4
    return np.int64(-1), 1


@njit(cache=True)
def _char(buf, i, n, classes):
    """(class, byte length) of the non-ASCII character (or invalid byte) at buf[i]."""
    cp, length = decode_utf8(
        buf[i],
        buf[i + 1] if i + 1 < n else 0,
        buf[i + 2] if i + 2 < n else 0,
        buf[i + 3] if i + 3 < n else 0,
    )
    return (OTHER if cp < 0 else np.int64(classes[cp])), length


@njit(cache=True)
def piece_end(buf, i, n, classes):
    """Byte end of the pretoken that starts at buf[i] (i < n): GPT2_PATTERN's next match.

    ASCII is classified in line at each step (`b < 128`); calling a helper with array
    arguments per byte costs reference counting and made this 10x slower.
    """
    b = buf[i]
    if b == 39 and i + 1 < n:  # apostrophe: 's 't 'm 'd, then 're 've 'll
        c1 = buf[i + 1]
        if c1 == 115 or c1 == 116 or c1 == 109 or c1 == 100:
            return i + 2
        if i + 2 < n:
            c2 = buf[i + 2]
            if (c1 == 114 and c2 == 101) or (c1 == 118 and c2 == 101) or (c1 == 108 and c2 == 108):
                return i + 3
    if b < 128:
        cls, length = np.int64(classes[b]), 1
    else:
        cls, length = _char(buf, i, n, classes)
    j = i + length
    if b == 32 and j < n:  # one space joins the letters, numbers or others after it
        b = buf[j]
        if b < 128:
            c, length = np.int64(classes[b]), 1
        else:
            c, length = _char(buf, j, n, classes)
        if c != SPACE:
            cls = c
            j += length
    if cls != SPACE:  # a run of one class
        while j < n:
            b = buf[j]
            if b < 128:
                c, length = np.int64(classes[b]), 1
            else:
                c, length = _char(buf, j, n, classes)
            if c != cls:
                break
            j += length
        return j
    # Whitespace: \s+(?!\S) keeps the last blank for the word after it, else \s+.
    last = i
    while j < n:
        b = buf[j]
        if b < 128:
            c, length = np.int64(classes[b]), 1
        else:
            c, length = _char(buf, j, n, classes)
        if c != SPACE:
            break
        last = j
        j += length
    if j == n or last == i:
        return j
    return last


@njit(cache=True)
def piece_bounds(buf, classes):
    """int64[P+1]: byte offsets of the P pretokens of buf (the split itself, for tests)."""
    n = buf.size
    out = np.empty(n + 1, np.int64)
    out[0] = 0
    k = 0
    i = 0
    while i < n:
        i = piece_end(buf, i, n, classes)
        k += 1
        out[k] = i
    return out[: k + 1].copy()


def safe_cuts(buf: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """int64 cuts c in [lo, hi) where a pretoken boundary does not depend on context
    (needs 1 <= lo and hi < len(buf)).

    An ASCII letter, a space, an ASCII letter: the word before ends at c whatever follows,
    and " word" starts at c whatever precedes, so pretokenizing buf[:c] and buf[c:] apart
    gives the same pieces as pretokenizing buf whole.
    """
    if hi <= lo:
        return np.zeros(0, np.int64)
    w = buf[lo - 1 : hi + 1] | np.uint8(32)
    letter = (w >= 97) & (w <= 122)
    space = buf[lo:hi] == 32
    return lo + np.flatnonzero(letter[:-2] & space & letter[2:])
