"""Data pipeline timings (pytest-benchmark): loader batches, SFT batches, preparation MB/s.

Run: pytest bench/test_bench_data.py --benchmark-only
The preparation benchmark reads ../shared/data/books when present and is skipped otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.data.corpus import file_source
from euler.data.loader import TokenLoader
from euler.data.prepare import prepare_corpus
from euler.data.sft import SFTDataset, prepare_sft
from euler.data.shards import write_shard

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    """A 20M-token uint16 shard, as one file."""
    folder = tmp_path_factory.mktemp("shards")
    ids = np.random.default_rng(0).integers(0, 4096, size=20_000_000)
    write_shard(folder / "train.bin", ids, 4096)
    return folder


@pytest.mark.parametrize(("B", "T"), [(16, 128), (8, 512)])
def test_loader_batch(benchmark, shard_dir, B, T):
    loader = TokenLoader([shard_dir / "train.bin"])
    step = iter(range(10**9))
    out = benchmark(lambda: loader.batch(next(step), 0, B, T, 4))
    assert out.shape == (B, T + 4)


def test_sft_batch(benchmark, tmp_path):
    records = [
        {"instruction": f"Question {i}?", "input": "", "output": "An answer. " * (i % 50)}
        for i in range(2000)
    ]
    (tmp_path / "a.json").write_text(json.dumps(records))
    (tmp_path / "s.txt").write_text(json.dumps(records[:200]))
    tok = Tokenizer.train([tmp_path / "s.txt"], 300)
    prepare_sft([str(tmp_path / "a.json")], tmp_path / "sft", tok, context=512, progress=False)
    data = SFTDataset(tmp_path / "sft")
    step = iter(range(10**9))
    tokens, mask = benchmark(lambda: data.batch(next(step), 0, 8, 512, 4))
    assert tokens.shape == mask.shape == (8, 516)


@pytest.mark.skipif(not (SHARED / "books").is_dir(), reason="shared/data/books not present")
def test_prepare_books_mb_per_s(benchmark, tmp_path):
    books = sorted((SHARED / "books").glob("*.txt"))[:10]
    (tmp_path / "s.txt").write_text(books[0].read_text(encoding="utf-8")[:1_000_000])
    tok = Tokenizer.train([tmp_path / "s.txt"], 512)
    src = [file_source("books", [str(b) for b in books], progress=False)]
    runs = iter(range(10**9))
    m = benchmark.pedantic(
        lambda: prepare_corpus(src, tmp_path / f"p{next(runs)}", tokenizer=tok),
        rounds=2,
        iterations=1,
    )
    benchmark.extra_info["mb_per_s"] = m["totals"]["mb_per_s"]
    assert m["totals"]["tokens"]["train"] > 0
