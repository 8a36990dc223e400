"""Tokenizer timings (pytest-benchmark): training, encode MB/s on 1 and 2 threads, and
bytes per token on a held-out book, ours against Hugging Face `tokenizers` (0.23 here).

Run: pytest bench/test_bench_tokenizer.py --benchmark-only --benchmark-json=OUT.json
Needs ../shared/data/books (skipped when absent). One novel is held out of training; the
encode text is that novel plus ten training books, cut into paragraphs (documents), and
both libraries encode the same documents with the same merges (our HF export).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from euler.tokenizer import SPECIAL_TOKENS, Tokenizer

tokenizers = pytest.importorskip("tokenizers")

BOOKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "books"
HELD_OUT = "pg74_the-adventures-of-tom-sawyer.txt"
pytestmark = pytest.mark.skipif(not BOOKS.is_dir(), reason="shared/data/books not present")

TRAINED: dict[tuple[str, int], object] = {}  # (library, vocab) -> tokenizer, for reuse


def train_files() -> list[Path]:
    return [p for p in sorted(BOOKS.glob("*.txt")) if p.name != HELD_OUT]


def read(path: Path) -> str:
    """A book's text with its CRLF line ends kept (read_text would turn them into LF)."""
    return path.read_bytes().decode("utf-8")


def held_out() -> str:
    return read(BOOKS / HELD_OUT)


def hf_train(files: list[Path], vocab_size: int):
    """A ByteLevel BPE of `tokenizers` with our vocabulary layout: 256 bytes, 4 specials."""
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    return tok


def ours(vocab_size: int) -> Tokenizer:
    if ("ours", vocab_size) not in TRAINED:
        TRAINED["ours", vocab_size] = Tokenizer.train(train_files(), vocab_size)
    return TRAINED["ours", vocab_size]


@contextlib.contextmanager
def cpu_over_wall(benchmark):
    """Record process CPU time / wall time over the block: near the thread count when the
    threads really ran at once, near 1 when other work on the machine held the cores."""
    cpu, wall = time.process_time(), time.perf_counter()
    yield
    ratio = (time.process_time() - cpu) / (time.perf_counter() - wall)
    benchmark.extra_info["cpu_over_wall"] = round(ratio, 2)


def documents() -> list[str]:
    """About 10 MB of paragraphs (each keeps its blank-line separator)."""
    text = held_out() + "".join(read(p) for p in train_files()[:40:2])
    paras = text.split("\r\n\r\n")
    return [p + "\r\n\r\n" for p in paras[:-1]] + [paras[-1]]


@pytest.mark.parametrize("vocab_size", [512, 4096])
@pytest.mark.parametrize("library", ["ours", "hf"])
def test_train_and_bytes_per_token(benchmark, library, vocab_size):
    files = train_files()
    if library == "ours":
        tok = benchmark.pedantic(Tokenizer.train, (files, vocab_size), rounds=1, iterations=1)
        n_tokens = len(tok.encode(held_out()))
    else:
        tok = benchmark.pedantic(hf_train, (files, vocab_size), rounds=1, iterations=1)
        n_tokens = len(tok.encode(held_out()).ids)
        assert tok.get_vocab_size() == vocab_size
    TRAINED[library, vocab_size] = tok
    benchmark.extra_info["train_mb"] = round(sum(f.stat().st_size for f in files) / 1e6, 2)
    benchmark.extra_info["held_out"] = HELD_OUT
    benchmark.extra_info["bytes_per_token"] = round(len(held_out().encode()) / n_tokens, 4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("library", ["ours", "hf"])
def test_encode_mb_per_s(benchmark, monkeypatch, library, threads):
    tok = ours(4096)
    docs = documents()
    n_bytes = sum(len(d.encode()) for d in docs)
    if library == "ours":
        run = lambda: [a.size for a in tok.encode_batch(docs, threads=threads)]
    else:
        # `tokenizers` reads this at every batch: "false" keeps it on the calling thread.
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true" if threads > 1 else "false")
        hf = tokenizers.Tokenizer.from_str(tok.to_hf_json())
        run = lambda: [len(e.ids) for e in hf.encode_batch(docs)]
    with cpu_over_wall(benchmark):
        lengths = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert sum(lengths) == sum(a.size for a in tok.encode_batch(docs))
    benchmark.extra_info["documents"] = len(docs)
    benchmark.extra_info["mb"] = round(n_bytes / 1e6, 2)
    benchmark.extra_info["mb_per_s_best"] = round(n_bytes / 1e6 / benchmark.stats.stats.min, 2)


@pytest.mark.parametrize("threads", [1, 2])
def test_encode_one_document_mb_per_s(benchmark, threads):
    """The same text as one string: two threads split it at context-free cuts."""
    tok = ours(4096)
    text = "".join(documents())
    with cpu_over_wall(benchmark):
        ids = benchmark.pedantic(
            tok.encode_batch, ([text],), {"threads": threads}, rounds=3, iterations=1
        )
    assert (ids[0] == tok.encode(text)).all()
    mb = len(text.encode()) / 1e6
    benchmark.extra_info["mb"] = round(mb, 2)
    benchmark.extra_info["mb_per_s_best"] = round(mb / benchmark.stats.stats.min, 2)


def test_pathological_inputs(benchmark):
    """1 MB of one repeated byte and a 10 MB line with no spaces (huge pretokens)."""
    import random

    tok = ours(4096)
    rng = random.Random(0)
    line = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz,.;!?-", k=10_000_000))
    texts = ["e" * 1_000_000, line]
    ids = benchmark.pedantic(lambda: [tok.encode(t) for t in texts], rounds=1, iterations=1)
    assert [tok.decode(i) for i in ids] == texts
    benchmark.extra_info["seconds_total"] = round(benchmark.stats.stats.min, 2)
