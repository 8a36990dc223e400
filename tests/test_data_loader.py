"""TokenLoader: windows from the shards, determinism from (seed, step), weights, sequential mode."""

from __future__ import annotations

import numpy as np
import pytest

from euler.data.loader import TokenLoader
from euler.data.manifest import write_manifest
from euler.data.shards import write_shard
from euler.errors import EulerError

V = 1000


def make_folder(tmp_path, weights=(None, None), sizes=(5000, 3000)):
    """Two sources whose token values tell them apart: a in [0, 500), b in [500, 1000)."""
    sources, names = [], []
    per_split = {"train": 0, "val": 0}
    for k, (name, n, w) in enumerate(zip("ab", sizes, weights, strict=True)):
        for split in ("train", "val"):
            ids = (np.arange(n) % 500) + 500 * k
            write_shard(tmp_path / f"{name}-{split}-000.bin", ids, V)
            names.append(f"{name}-{split}-000.bin")
        shards = {s: [f"{name}-{s}-000.bin"] for s in ("train", "val")}
        counts = {"documents": per_split, "tokens": per_split, "text_bytes": per_split}
        sources.append({"name": name, "weight": w, "shards": shards, **counts})
    totals = {
        "tokens": per_split, "text_bytes": 0, "val_token_fraction": 0.5, "bytes_per_token": 1.0,
        "seconds": 0.0, "mb_per_s": None, "threads": 1,
    }  # fmt: skip
    tokenizer = {"file": "tokenizer.json", "sha256": "ab" * 32, "vocab_size": V, "eot_id": 256}
    manifest = {"kind": "pretrain", "tokenizer": tokenizer, "sources": sources, "totals": totals}
    write_manifest(tmp_path, manifest, names)
    return tmp_path


def test_windows_are_consecutive_tokens(tmp_path):
    loader = TokenLoader(make_folder(tmp_path))
    batch = loader.batch(step=0, seed=1, B=16, T=32, K=4)
    assert batch.shape == (16, 36) and batch.dtype == np.int32
    steps = np.diff(batch, axis=1) % 500
    assert np.all(steps == 1)  # each row is a run of the arange pattern


def test_same_seed_and_step_after_restart(tmp_path):
    folder = make_folder(tmp_path)
    first = [TokenLoader(folder).batch(s, 7, 8, 16, 4) for s in range(5)]
    resumed = TokenLoader(folder)  # a fresh process resuming at step 3
    np.testing.assert_array_equal(resumed.batch(3, 7, 8, 16, 4), first[3])
    np.testing.assert_array_equal(resumed.batch(4, 7, 8, 16, 4), first[4])
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], TokenLoader(folder).batch(0, 8, 8, 16, 4))


def test_source_weights(tmp_path):
    by_tokens = TokenLoader(make_folder(tmp_path / "t", sizes=(9000, 1000)))
    share_b = np.mean(by_tokens.batch(0, 0, 4000, 8, 1)[:, 0] >= 500)
    assert 0.07 < share_b < 0.13  # b has about a tenth of the windows
    weighted = TokenLoader(make_folder(tmp_path / "w", weights=(1.0, 3.0), sizes=(9000, 1000)))
    share_b = np.mean(weighted.batch(0, 0, 4000, 8, 1)[:, 0] >= 500)
    assert 0.72 < share_b < 0.78


def test_sequential_walks_every_shard_once(tmp_path):
    loader = TokenLoader(make_folder(tmp_path, sizes=(1000, 600)), split="val")
    T, K, B = 100, 4, 3
    batches = list(loader.iter_sequential(B, T, K))
    rows = np.concatenate(batches)
    # windows start every T tokens: 9 in a (0..800), 5 in b (0..400); 14 rows -> 4 full batches
    assert len(batches) == 4 and rows.shape == (12, T + K)
    np.testing.assert_array_equal(rows[0], np.arange(104) % 500)
    np.testing.assert_array_equal(rows[1, 0], 100)
    np.testing.assert_array_equal(rows[9, :3], [500, 501, 502])


def test_files_instead_of_folder(tmp_path):
    write_shard(tmp_path / "x.bin", np.arange(100), V)
    loader = TokenLoader([tmp_path / "x.bin"])
    assert loader.n_tokens == 100 and loader.batch(0, 0, 2, 10, 1).shape == (2, 11)


def test_errors(tmp_path):
    folder = make_folder(tmp_path / "f")
    with pytest.raises(EulerError, match="vocabulary of 1000 tokens, but the tokenizer has 512"):
        TokenLoader(folder, vocab_size=512)
    with pytest.raises(EulerError, match="T\\+K = 6000"):
        TokenLoader(folder).batch(0, 0, 1, 5996, 4)
    with pytest.raises(EulerError, match="not by the given"):
        TokenLoader(folder).check_tokenizer("cd" * 32)
    with pytest.raises(EulerError, match="split must be"):
        TokenLoader(folder, split="test")
    with pytest.raises(EulerError, match="no manifest.json"):
        TokenLoader(tmp_path)


def test_a_changed_shard_is_refused_at_open_and_a_bad_id_at_its_batch(tmp_path):
    folder = make_folder(tmp_path)
    path = folder / "a-train-000.bin"
    raw = bytearray(path.read_bytes())
    raw[40] ^= 0xFF  # inside the first sampled block
    path.write_bytes(bytes(raw))
    with pytest.raises(EulerError, match="a-train-000.bin: contents differ"):
        TokenLoader(folder)
    # an id >= V in a shard opened without a manifest: named with its position at use
    write_shard(tmp_path / "x.bin", np.r_[np.arange(50), 999, np.arange(50)], V)
    raw = bytearray((tmp_path / "x.bin").read_bytes())
    raw[12:16] = (900).to_bytes(4, "little")  # the header now claims V = 900
    (tmp_path / "x.bin").write_bytes(bytes(raw))
    loader = TokenLoader([tmp_path / "x.bin"])
    with pytest.raises(EulerError, match="x.bin: position 50: token id 999 is outside"):
        list(loader.iter_sequential(1, 100, 1))
