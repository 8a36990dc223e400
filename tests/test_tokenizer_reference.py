"""Property tests (hypothesis): the compiled pretokenizer equals the GPT-2 regex, encoding
equals GPT-2's rank-order merge written plainly in Python, and every string and every
byte string round-trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
import regex
from euler.tokenizer import Tokenizer
from euler.tokenizer import tokenizer as tokenizer_module
from euler.tokenizer.pretokenize import GPT2_PATTERN, char_classes, piece_bounds, safe_cuts
from hypothesis import given, settings
from hypothesis import strategies as st

FIRST_MERGE_ID = 260
SAMPLE = "aab ab 'st're'll 'S 12 3.5 é東京😀\u00a0\u3000\u2028\t\r\n  !?'\"()—“”"

texts = st.one_of(
    st.text(),  # any code points (hypothesis leaves out lone surrogates)
    st.text(alphabet=SAMPLE, max_size=80),  # dense in the pattern's corner cases
    st.text(alphabet="ab", max_size=64),  # one short pretoken, many equal pairs
    st.text(alphabet="ab", min_size=65, max_size=400),  # one long pretoken: the heap path
)


def reference_pieces(data: bytes) -> list[bytes]:
    """GPT-2 pretokens of data via the regex, invalid UTF-8 as surrogate escapes."""
    text = data.decode("utf-8", "surrogateescape")
    return [p.encode("utf-8", "surrogateescape") for p in regex.findall(GPT2_PATTERN, text)]


def reference_encode(merges: np.ndarray, data: bytes) -> list[int]:
    """GPT-2's bpe(): merge every occurrence of the lowest-ranked pair, left to right."""
    rank = {(a, b): r for r, (a, b) in enumerate(merges.tolist())}
    out: list[int] = []
    for piece in reference_pieces(data):
        ids = list(piece)
        while len(ids) > 1:
            pairs = {(a, b) for a, b in zip(ids, ids[1:], strict=False) if (a, b) in rank}
            if not pairs:
                break
            best = min(pairs, key=rank.__getitem__)
            merged, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    merged.append(FIRST_MERGE_ID + rank[best])
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        out += ids
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    rng = random.Random(0)
    words = SAMPLE.split() + "the quick brown fox don't we'll a aa aaa ab abab".split()
    text = " ".join(rng.choice(words) for _ in range(40000))
    text += " " + " ".join("".join(rng.choices("ab", k=rng.randint(2, 200))) for _ in range(3000))
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_bytes(text.encode())
    return Tokenizer.train([path], 700)


def _our_pieces(data: bytes) -> list[bytes]:
    bounds = piece_bounds(np.frombuffer(data, np.uint8), char_classes()).tolist()
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(texts)
def test_pretokens_equal_regex_on_text(text):
    data = text.encode()
    assert _our_pieces(data) == reference_pieces(data)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=60)
    | st.lists(st.sampled_from(SAMPLE.encode() + b"\x80\xff\xc3\xe2\xed\xf0\xf4"), max_size=60).map(
        bytes
    )
)
def test_pretokens_equal_regex_on_any_bytes(data):
    assert _our_pieces(data) == reference_pieces(data)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_encode_equals_rank_order_merge(tok, text):
    ids = tok.encode(text)
    assert ids.tolist() == reference_encode(tok.merges, text.encode())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_encode_bytes_equals_rank_order_merge(tok, data):
    assert tok.encode_bytes(data).tolist() == reference_encode(tok.merges, data)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_text_round_trips(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_bytes_round_trip(tok, data):
    assert tok.decode_bytes(tok.encode_bytes(data)) == data


def test_runs_equal_rank_order_merge(tok):
    # Overlapping equal pairs ("aaa": which "aa" first?) on both merge paths.
    for unit in ("a", "ab", "aab", "abb", " a"):
        for n in range(1, 160):
            text = unit * n
            assert tok.encode(text).tolist() == reference_encode(tok.merges, text.encode()), text


# Texts built from the fragments the pattern cares about: runs of blanks, words, marks.
fragments = st.lists(
    st.sampled_from(["a", "Bc", " ", "  ", "\n", "\r\n", "\t", "'s", "'", "7", "é", "!", " x"]),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(fragments | st.text(alphabet=SAMPLE + "xyzXYZ  ", max_size=120))
def test_safe_cuts_split_pretokens_exactly(text):
    data = text.encode()
    buf = np.frombuffer(data, np.uint8)
    whole = reference_pieces(data)
    for c in safe_cuts(buf, 1, len(data) - 1).tolist():
        assert reference_pieces(data[:c]) + reference_pieces(data[c:]) == whole


@settings(max_examples=100, deadline=None)
@given(st.lists(texts | fragments, max_size=6), st.booleans())
def test_threads_split_anywhere_safe_and_agree(tok, batch, allow_special):
    # Let two threads split even tiny inputs, at the first safe cut they find.
    saved = tokenizer_module._PARALLEL_MIN_BYTES
    tokenizer_module._PARALLEL_MIN_BYTES = 1
    try:
        got = tok.encode_batch(batch, allow_special=allow_special, threads=2)
    finally:
        tokenizer_module._PARALLEL_MIN_BYTES = saved
    want = [tok.encode(t, allow_special=allow_special) for t in batch]
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
