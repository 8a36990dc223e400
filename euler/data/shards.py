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
        self._put(self._header())  # placeholder; rewritten with the final count

    def _header(self) -> bytes:
        return HEADER.pack(
            MAGIC, SHARD_VERSION, self.vocab_size, self.count, self.dtype.itemsize, 0
        )

    def write(self, values: np.ndarray) -> None:
        """Append a 1-D array (cast to the shard's dtype; values must fit it)."""
        values = np.asarray(values)
        if values.size and (values.min() < 0 or values.max() > np.iinfo(self.dtype).max):
            raise EulerError(f"{self.path.name}: value out of range for {self.dtype}")
        self._put(values.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self.count += values.size

    def _put(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:  # a full disk names no file by itself
            self.abort()
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def close(self) -> None:
        """Write the final header, fsync and move the shard into place."""
        try:
            self._f.seek(0)
            self._f.write(self._header())
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial shard."""
        try:
            self._f.close()  # may fail again on a full disk: the file goes regardless
        except OSError:
            pass
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


def read_header(path: Path, itemsize: int | None = None) -> dict:
    """Parse and check a shard header: returns vocab_size, count, dtype. Raises EulerError.

    itemsize: the element size this shard must have (e.g. 1 for a mask), when known.
    """
    path = Path(path)
    if not path.is_file():
        raise EulerError(f"shard not found: {path}")
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if not raw.startswith(MAGIC[: len(raw)]) or not raw:
        # a pickle, a zip, a .npy or random bytes: say what it is not, not "truncated"
        raise EulerError(
            f"{path}: not a NanoEuler shard (starts with {raw[:8]!r}, a shard with {MAGIC!r})"
        )
    if len(raw) < HEADER_SIZE:
        raise EulerError(f"{path}: truncated shard ({len(raw)} bytes, the header alone is 32)")
    _, version, vocab_size, count, size, _ = HEADER.unpack(raw)
    if version != SHARD_VERSION:
        raise EulerError(f"{path}: shard version {version}, this code reads {SHARD_VERSION}")
    if size not in DTYPES or (itemsize is not None and size != itemsize):
        want = itemsize if itemsize is not None else "1, 2, 4 or 8"
        raise EulerError(f"{path}: header: element size {size}, expected {want}")
    expected = HEADER_SIZE + count * size
    actual = path.stat().st_size
    if actual != expected:
        raise EulerError(
            f"{path}: header says {count} elements ({expected} bytes) but the file has "
            f"{actual} bytes (truncated or corrupt)"
        )
    return {"vocab_size": vocab_size, "count": count, "dtype": np.dtype(DTYPES[size])}


def open_shard(
    path: Path, vocab_size: int | None = None, itemsize: int | None = None
) -> np.ndarray:
    """Memory-map a shard's array (read-only); check V against `vocab_size` and the
    element size against `itemsize` when given."""
    head = read_header(path, itemsize)
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


def first_out_of_range(values: np.ndarray, limit: int, chunk: int = 1 << 24) -> int:
    """Index of the first value >= limit, or -1; reads `values` a chunk at a time."""
    for lo in range(0, len(values), chunk):
        bad = np.flatnonzero(np.asarray(values[lo : lo + chunk]) >= limit)
        if bad.size:
            return lo + int(bad[0])
    return -1
