"""Shard format: round trip, dtype choice, and the one-line errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest

from euler.data.shards import HEADER_SIZE, ShardWriter, open_shard, read_header, write_shard
from euler.errors import EulerError


@pytest.mark.parametrize(
    ("vocab", "dtype"), [(512, np.uint16), (65536, np.uint16), (70000, np.uint32)]
)
def test_round_trip_and_dtype(tmp_path, vocab, dtype):
    ids = np.random.default_rng(0).integers(0, vocab, size=1000)
    write_shard(tmp_path / "s.bin", ids, vocab)
    head = read_header(tmp_path / "s.bin")
    assert head["vocab_size"] == vocab and head["count"] == 1000 and head["dtype"] == dtype
    assert (tmp_path / "s.bin").stat().st_size == HEADER_SIZE + 1000 * np.dtype(dtype).itemsize
    np.testing.assert_array_equal(open_shard(tmp_path / "s.bin", vocab), ids)


def test_streamed_writes_concatenate(tmp_path):
    with ShardWriter(tmp_path / "s.bin", 300, np.uint16) as w:
        w.write(np.array([256, 1, 2]))
        w.write(np.array([256, 3]))
    np.testing.assert_array_equal(open_shard(tmp_path / "s.bin"), [256, 1, 2, 256, 3])


def test_interrupted_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path / "s.bin", 300, np.uint16) as w:
            w.write(np.arange(10))
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_value_out_of_range(tmp_path):
    with pytest.raises(EulerError, match="out of range"):
        write_shard(tmp_path / "s.bin", np.array([70000]), 512)
    assert list(tmp_path.iterdir()) == []


def test_wrong_magic_truncated_and_vocab_mismatch(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(100), 512)
    raw = (tmp_path / "s.bin").read_bytes()
    (tmp_path / "magic.bin").write_bytes(b"NOTASHRD" + raw[8:])
    with pytest.raises(EulerError, match="not a NanoEuler shard"):
        open_shard(tmp_path / "magic.bin")
    (tmp_path / "cut.bin").write_bytes(raw[:-10])
    with pytest.raises(EulerError, match="truncated"):
        open_shard(tmp_path / "cut.bin")
    (tmp_path / "tiny.bin").write_bytes(raw[:5])
    with pytest.raises(EulerError, match="truncated shard"):
        open_shard(tmp_path / "tiny.bin")
    foreign = {
        "pickle": b"\x80\x04\x95" + bytes(60),
        "zip": b"PK\x03\x04" + bytes(8),
        "random": np.random.default_rng(0).bytes(4096),
        "empty": b"",
    }
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(EulerError, match=f"{name}: not a NanoEuler shard"):
            open_shard(tmp_path / name)
    with pytest.raises(EulerError, match="vocabulary of 512 tokens, but the tokenizer has 1024"):
        open_shard(tmp_path / "s.bin", vocab_size=1024)
    with pytest.raises(EulerError, match="not found"):
        open_shard(tmp_path / "missing.bin")
