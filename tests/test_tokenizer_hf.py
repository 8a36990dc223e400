"""The Hugging Face export: `tokenizers`, loaded from our tokenizer.json, gives our ids."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from euler.tokenizer import Tokenizer

tokenizers = pytest.importorskip("tokenizers")

BOOKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "books"
TRAIN_BOOKS = ["pg11_alices-adventures-in-wonderland.txt", "pg1080_a-modest-proposal.txt"]
TEST_BOOK = "pg12_through-the-looking-glass.txt"


def _generated(seed: int, n: int) -> str:
    rng = random.Random(seed)
    words = "the of and to in it's we'll Éire naïve 東京 😀 42 3.14 — “x” (y) don't".split()
    seps = [" ", " ", " ", ", ", ".\r\n", "\n\n", "  ", "\t"]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n))


def _hf(tok: Tokenizer):
    return tokenizers.Tokenizer.from_str(tok.to_hf_json())


def test_hf_export_gives_identical_ids_on_generated_text(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(_generated(0, 20000).encode())
    tok = Tokenizer.train([path], 400)
    hf = _hf(tok)
    text = _generated(1, 5000)
    ids = tok.encode(text)
    assert hf.encode(text).ids == ids.tolist()
    assert hf.decode(ids.tolist()) == text
    chat = "<|user|>Hi there!<|end|><|assistant|>Hello.<|end|><|endoftext|>"
    assert hf.encode(chat).ids == tok.encode(chat, allow_special=True).tolist()


@pytest.mark.skipif(not (BOOKS / TEST_BOOK).exists(), reason="shared/data/books not present")
def test_hf_export_gives_identical_ids_on_a_held_out_book(tmp_path):
    tok = Tokenizer.train([BOOKS / b for b in TRAIN_BOOKS], 1024)
    path = tmp_path / "tokenizer.json"
    tok.export_hf(path)
    hf = tokenizers.Tokenizer.from_file(str(path))
    text = (BOOKS / TEST_BOOK).read_text(encoding="utf-8")
    ids = tok.encode(text)
    assert hf.encode(text).ids == ids.tolist()
    lines = text.splitlines(keepends=True)[:2000]
    got = [e.ids for e in hf.encode_batch(lines)]
    assert got == [a.tolist() for a in tok.encode_batch(lines)]
