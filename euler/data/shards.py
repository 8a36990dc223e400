"""The shard file format: a 32-byte header, then one flat little-endian array.

Header (little-endian, 32 bytes):

    magic      8s   b"EULERTOK"
    version    u32  SHARD_VERSION
    vocab_size u32  V of the tokenizer that wrote it
    count      u64  number of array elements after the header
    itemsize   u32  bytes per element: 2 (uint16, V <= 65536) or 4 (uint32) for tokens;
                    1 (uint8) for SFT loss masks, 8 (uint64) for SFT record offsets
    reserved   u32  0

Documents inside a token shard are separated by the end-of-text token. A shard is
written under a temporary name and renamed only once its header carries the final
count, so a file with the right name is always complete.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from euler.data.files import make_temp
from euler.errors import EulerError

MAGIC = b"EULERTOK"
SHARD_VERSION = 1
HEADER = struct.Struct("<8sIIQII")
HEADER_SIZE = HEADER.size  # 32
DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned type that holds every id of a V-token vocabulary."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


class ShardWriter:
    """Stream arrays into one shard; `close()` publishes it, `abort()` leaves nothing.

    Use as a context manager: an exception inside the block aborts the shard.
    """

    def __init__(self, path: Path, vocab_size: int, dtype: type[np.unsignedinteger]) -> None:
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.dtype = np.dtype(dtype)
        self.count = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = make_temp(self.path.parent, self.path.name)
        self._f = os.fdopen(fd, "wb")
        self._f.write(self._header())  # placeholder; rewritten with the final count

    def _header(self) -> bytes:
        return HEADER.pack(
            MAGIC, SHARD_VERSION, self.vocab_size, self.count, self.dtype.itemsize, 0
        )

    def write(self, values: np.ndarray) -> None:
        """Append a 1-D array (cast to the shard's dtype; values must fit it)."""
        values = np.asarray(values)
        if values.size and (values.min() < 0 or values.max() > np.iinfo(self.dtype).max):
            raise EulerError(f"{self.path.name}: value out of range for {self.dtype}")
        self._f.write(values.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self.count += values.size

    def close(self) -> None:
        """Write the final header, fsync and move the shard into place."""
        self._f.seek(0)
        self._f.write(self._header())
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial shard."""
        self._f.close()
        Path(self._tmp).unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shard(path: Path, values: np.ndarray, vocab_size: int, dtype=None) -> None:
    """Write one array as a complete shard (dtype defaults to the token dtype for V)."""
    with ShardWriter(path, vocab_size, dtype or token_dtype(vocab_size)) as w:
        w.write(values)


def read_header(path: Path) -> dict:
    """Parse and check a shard header: returns vocab_size, count, dtype. Raises EulerError."""
    path = Path(path)
    if not path.is_file():
        raise EulerError(f"shard not found: {path}")
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise EulerError(f"{path}: too short to be a shard ({len(raw)} bytes)")
    magic, version, vocab_size, count, itemsize, _ = HEADER.unpack(raw)
    if magic != MAGIC:
        raise EulerError(f"{path}: not a NanoEuler shard (magic {magic!r}, expected {MAGIC!r})")
    if version != SHARD_VERSION:
        raise EulerError(f"{path}: shard version {version}, this code reads {SHARD_VERSION}")
    if itemsize not in DTYPES:
        raise EulerError(f"{path}: bad element size {itemsize} in header")
    expected = HEADER_SIZE + count * itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise EulerError(
            f"{path}: header says {count} elements ({expected} bytes) but the file has "
            f"{actual} bytes (truncated or corrupt)"
        )
    return {"vocab_size": vocab_size, "count": count, "dtype": np.dtype(DTYPES[itemsize])}


def open_shard(path: Path, vocab_size: int | None = None) -> np.ndarray:
    """Memory-map a shard's array (read-only); check V against `vocab_size` when given."""
    head = read_header(path)
    if vocab_size is not None and head["vocab_size"] != vocab_size:
        raise EulerError(
            f"{path}: shard was written for a vocabulary of {head['vocab_size']} tokens, "
            f"but the tokenizer has {vocab_size}"
        )
    if head["count"] == 0:
        return np.zeros(0, dtype=head["dtype"])
    return np.memmap(
        path,
        dtype=head["dtype"].newbyteorder("<"),
        mode="r",
        offset=HEADER_SIZE,
        shape=(head["count"],),
    )
