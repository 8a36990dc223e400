"""The embedded default corpus: CPython's own documentation, prepared once into the cache."""

from __future__ import annotations

import itertools

import pytest

from euler.cache import cache_root
from euler.data import default_corpus, default_corpus_dir
from euler.data.corpus import CorpusSource
from euler.data.loader import TokenLoader
from euler.errors import EulerError


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.delenv("EULER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "nanoeuler"
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_embedded_text_is_english_documentation():
    topics = list(default_corpus.pydoc_topics())
    assert len(topics) > 50 and sum(map(len, topics)) > 200_000
    assert any('The "if" statement is used for conditional execution' in t for t in topics)
    first = list(itertools.islice(default_corpus.stdlib_docstrings(), 3))
    assert len(first) == 3 and all(len(d) >= default_corpus.MIN_DOCSTRING for d in first)


def test_prepared_once_with_a_message(monkeypatch, tmp_path):
    """The real sources cost ~20 s, so this uses a slice of the pydoc topics."""
    topics = list(default_corpus.pydoc_topics())[:30]
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        default_corpus,
        "default_sources",
        lambda: [CorpusSource("pydoc-topics", lambda: iter(topics))],
    )
    said: list[str] = []
    folder = default_corpus_dir(vocab_size=300, log=said.append)
    assert folder.is_relative_to(tmp_path / "cache")
    assert "CPython" in said[0] and "documentation" in said[0] and str(folder) in said[0]
    loader = TokenLoader(folder, vocab_size=300)
    assert loader.n_tokens > 10_000 and TokenLoader(folder, "val").n_tokens > 0

    said.clear()
    assert default_corpus_dir(vocab_size=300, log=said.append) == folder
    assert said == []  # cached: nothing prepared, nothing said

    (folder / "manifest.json").write_text("{ broken")
    assert default_corpus_dir(vocab_size=300, log=said.append) == folder
    assert said and TokenLoader(folder).n_tokens == loader.n_tokens  # rebuilt the same


def test_too_small_vocabulary_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("EULER_CACHE", str(tmp_path))
    monkeypatch.setattr(
        default_corpus, "default_sources", lambda: [CorpusSource("x", lambda: iter(["some text"]))]
    )
    with pytest.raises(EulerError, match="too small"):
        default_corpus_dir(vocab_size=256, log=lambda _: None)
    assert not any((tmp_path / "default-corpus").glob("*/manifest.json"))
