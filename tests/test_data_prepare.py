"""Pretraining preparation end to end with a tokenizer trained inside the test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.data.corpus import file_source
from euler.data.loader import TokenLoader
from euler.data.manifest import read_manifest
from euler.data.prepare import is_val, prepare_corpus
from euler.data.shards import open_shard
from euler.errors import EulerError

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hum".split()


def book(title: str, n: int, seed: int) -> str:
    words = np.random.default_rng(seed).choice(WORDS, size=n)
    body = "\r\n".join(" ".join(words[i : i + 12]) for i in range(0, n, 12))
    return (
        f"The Project Gutenberg EBook of {title}\r\n\r\n"
        f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n\r\n"
        f"{body}\r\n\r\n*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n"
        "THE FULL PROJECT GUTENBERG LICENSE\r\n"
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "books").mkdir()
    for i in range(12):
        (root / "books" / f"pg{i}.txt").write_text(book(f"Book {i}", 300 + 20 * i, i))
    rows = [{"text": f"web page {i}: " + " ".join(WORDS[i % 5 :])} for i in range(40)]
    (root / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def tok(corpus, tmp_path_factory) -> Tokenizer:
    sample = tmp_path_factory.mktemp("tok") / "sample.txt"
    sample.write_text(" ".join(WORDS) * 50)
    return Tokenizer.train([sample], 300)


def sources(corpus, **kw):
    return [
        file_source("books", [str(corpus / "books")], progress=False, **kw),
        file_source("web", [str(corpus / "web.jsonl")], progress=False),
    ]


def test_prepare_writes_shards_that_decode_to_the_documents(corpus, tok, tmp_path):
    out = tmp_path / "prep"
    m = prepare_corpus(sources(corpus), out, tokenizer=tok, val_fraction=0.25, seed=3)
    assert read_manifest(out, kind="pretrain") == json.loads((out / "manifest.json").read_text())
    assert Tokenizer.load(out / "tokenizer.json").sha256 == tok.sha256 == m["tokenizer"]["sha256"]
    books, web = m["sources"]
    assert books["documents"]["train"] + books["documents"]["val"] == 12
    assert web["documents"]["train"] + web["documents"]["val"] == 40
    assert books["documents"]["val"] > 0 and web["documents"]["val"] > 0
    assert len(books["inputs"]) == 12 and len(books["inputs"][0]["sha256"]) == 64

    # every document comes back exactly, preceded by <|endoftext|>, on its split's side
    for split in ("train", "val"):
        ids = np.concatenate([open_shard(out / f, tok.vocab_size) for f in books["shards"][split]])
        assert ids[0] == tok.eot_id and len(ids) == books["tokens"][split]
        docs = tok.decode(ids).split("<|endoftext|>")[1:]
        assert len(docs) == books["documents"][split]
        for d in docs:
            assert d.startswith("the ") or d.split()[0] in WORDS
            assert "Gutenberg" not in d and "\r" not in d
            assert is_val(d, 3, 0.25) == (split == "val")
    total = m["totals"]["tokens"]
    assert total["val"] / (total["train"] + total["val"]) == m["totals"]["val_token_fraction"]
    loader = TokenLoader(out, "train", vocab_size=tok.vocab_size)
    loader.check_tokenizer(tok.sha256)
    assert Tokenizer.load(loader.tokenizer_path).sha256 == tok.sha256
    assert loader.batch(0, 0, 4, 16, 2).max() < tok.vocab_size


def test_split_is_deterministic_and_seeded(corpus, tok, tmp_path):
    a = prepare_corpus(sources(corpus), tmp_path / "a", tokenizer=tok, seed=1, val_fraction=0.3)
    b = prepare_corpus(sources(corpus), tmp_path / "b", tokenizer=tok, seed=1, val_fraction=0.3)
    c = prepare_corpus(sources(corpus), tmp_path / "c", tokenizer=tok, seed=2, val_fraction=0.3)
    assert a["sources"] == b["sources"]
    assert (tmp_path / "a" / "web-val-000.bin").read_bytes() == (
        tmp_path / "b" / "web-val-000.bin"
    ).read_bytes()
    assert [s["tokens"] for s in a["sources"]] != [s["tokens"] for s in c["sources"]]


def test_trains_a_tokenizer_when_asked(corpus, tmp_path):
    m = prepare_corpus(sources(corpus), tmp_path / "p", vocab_size=280)
    assert m["tokenizer"]["vocab_size"] == 280
    assert Tokenizer.load(tmp_path / "p" / "tokenizer.json").sha256 == m["tokenizer"]["sha256"]


def test_weights_go_to_the_manifest(corpus, tok, tmp_path):
    srcs = [
        file_source("books", [str(corpus / "books")], 1.0, progress=False),
        file_source("web", [str(corpus / "web.jsonl")], 3.0, progress=False),
    ]
    m = prepare_corpus(srcs, tmp_path / "p", tokenizer=tok)
    assert [s["weight"] for s in m["sources"]] == [1.0, 3.0]


def test_failures_leave_nothing_half_written(corpus, tok, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n\n")
    with pytest.raises(
        EulerError, match="empty corpus: source .books. has no document left after cleaning"
    ):
        prepare_corpus([file_source("books", [str(empty)])], tmp_path / "out", tokenizer=tok)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(EulerError, match="no text column"):
        prepare_corpus([file_source("web", [str(bad)])], tmp_path / "out", tokenizer=tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty"]

    # a failed re-run keeps the earlier complete preparation as it was
    good = prepare_corpus(sources(corpus), tmp_path / "out", tokenizer=tok)
    with pytest.raises(EulerError, match="no text column"):
        prepare_corpus(
            [file_source("web", [str(bad)])], tmp_path / "out", tokenizer=tok, overwrite=True
        )
    assert read_manifest(tmp_path / "out")["sources"] == good["sources"]
    with pytest.raises(EulerError, match=r"pretraining data folder\); pass --overwrite"):
        prepare_corpus(sources(corpus), tmp_path / "out", tokenizer=tok)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(EulerError, match="no euler command wrote"):
        prepare_corpus(sources(corpus), tmp_path / "mine", tokenizer=tok)


def test_loader_refuses_a_tokenizer_of_another_vocabulary(corpus, tok, tmp_path):
    prepare_corpus(sources(corpus), tmp_path / "p", tokenizer=tok)
    with pytest.raises(EulerError, match="vocabulary of 300 tokens, but the tokenizer has 512"):
        TokenLoader(tmp_path / "p", vocab_size=512)


def test_weights_all_or_none_and_positive(corpus, tok, tmp_path):
    books = file_source("books", [str(corpus / "books")], 1.0, progress=False)
    web = file_source("web", [str(corpus / "web.jsonl")], progress=False)
    with pytest.raises(EulerError, match="every source or to none"):
        prepare_corpus([books, web], tmp_path / "p", tokenizer=tok)
    web.weight = 0.0
    with pytest.raises(EulerError, match="must be positive"):
        prepare_corpus([books, web], tmp_path / "p", tokenizer=tok)
