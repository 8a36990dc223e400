"""The Tokenizer: byte-level BPE with GPT-2 pretokenization and fixed special-token ids.

Ids: 0..255 are the bytes, 256..259 the special tokens (SPECIAL_TOKENS), 260.. the
merges in the order they were learned (merge r makes token 260 + r). The saved file is
our own canonical JSON; its SHA-256 (`Tokenizer.sha256`) names the tokenizer in data
manifests and checkpoints.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path

import numpy as np
import regex

from euler.errors import EulerError
from euler.schema import MISSING, Fields, describe, parse_json, read_json

from .bytetable import ByteTable, new_table
from .hf import hf_tokenizer_json
from .merge import encode_spans, pair_table
from .pretokenize import GPT2_PATTERN, char_classes, safe_cuts
from .train import check_inputs, count_pretokens, learn_merges

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 256,
    "<|user|>": 257,
    "<|assistant|>": 258,
    "<|end|>": 259,
}
FIRST_MERGE_ID = 256 + len(SPECIAL_TOKENS)
# Ids are int32 throughout; beyond 2^20 tokens the merge tables and a model's embedding
# would outgrow any corpus this package trains on, so a larger size is a typo.
MAX_VOCAB_SIZE = 1 << 20
FORMAT = "nanoeuler-bpe"
VERSION = 1

_SPECIAL_SPLIT = regex.compile("(" + "|".join(map(regex.escape, SPECIAL_TOKENS)) + ")")
_CACHE_ENTRIES, _CACHE_KEY_BYTES, _CACHE_IDS = 1 << 17, 2 << 20, 1 << 19
_PARALLEL_MIN_BYTES = 1 << 16  # below this, one thread is faster than two
_CUT_SEARCH_BYTES = 1 << 16  # how far past an even split to look for a safe cut


def _escape_surrogates(err: UnicodeError) -> tuple[bytes, int]:
    """Codec error handler: U+DC80..U+DCFF back to the raw byte (Python's surrogateescape
    convention for undecodable bytes), other lone surrogates as their 3-byte form."""
    out = bytearray()
    for ch in err.object[err.start : err.end]:
        c = ord(ch)
        out += bytes([c - 0xDC00]) if 0xDC80 <= c <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
    return bytes(out), err.end


codecs.register_error("euler.surrogates", _escape_surrogates)


def utf8(text: str) -> bytes:
    """text as UTF-8; lone surrogates as in _escape_surrogates, so bytes that came from
    data.decode("utf-8", "surrogateescape") become `data` again."""
    try:
        return text.encode("utf-8")  # the common case, on CPython's fast path
    except UnicodeEncodeError:
        return text.encode("utf-8", "euler.surrogates")


class Tokenizer:
    """Byte-level BPE. Build with Tokenizer.train or Tokenizer.load, not the constructor."""

    def __init__(self, merges: Sequence[tuple[int, int]]):
        self.merges = np.asarray(merges, np.int32).reshape(-1, 2)
        self._vocab = _vocab_bytes(self.merges)
        self._keys, self._ranks = pair_table(self.merges)
        self._caches: list[ByteTable] = []
        self._lock = threading.Lock()
        self.sha256 = hashlib.sha256(self.to_json().encode()).hexdigest()

    # ------------------------------------------------------------ identity

    @property
    def vocab_size(self) -> int:
        """Number of ids: 256 bytes + the specials + the merges."""
        return len(self._vocab)

    @property
    def special(self) -> dict[str, int]:
        """Special token text -> id."""
        return dict(SPECIAL_TOKENS)

    eot_id = SPECIAL_TOKENS["<|endoftext|>"]
    user_id = SPECIAL_TOKENS["<|user|>"]
    assistant_id = SPECIAL_TOKENS["<|assistant|>"]
    end_id = SPECIAL_TOKENS["<|end|>"]

    def token_bytes(self, i: int) -> bytes:
        """The bytes of token i (a special token's bytes are its text)."""
        return self._vocab[i]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]})"

    # ------------------------------------------------------------ training

    @classmethod
    def train(
        cls, files: Sequence[str | Path], vocab_size: int, progress: bool = False
    ) -> Tokenizer:
        """Learn vocab_size - 260 merges from text files (strict UTF-8, streamed).

        Deterministic: each step merges the most frequent pair of adjacent tokens; ties go
        to the smallest (left id, right id); a pair whose bytes already are a token is
        skipped (train.py states the full rule). Stops early if the files run out of pairs.
        """
        if vocab_size < FIRST_MERGE_ID:
            raise EulerError(
                f"vocab size {vocab_size} is too small: the 256 bytes and "
                f"{len(SPECIAL_TOKENS)} special tokens alone take {FIRST_MERGE_ID}"
            )
        if vocab_size > MAX_VOCAB_SIZE:
            raise EulerError(f"vocab size {vocab_size} is too large (at most {MAX_VOCAB_SIZE})")
        paths = check_inputs(list(files))
        total = sum(p.stat().st_size for p in paths)
        with _Progress(progress) as bar:
            task = bar.add("counting pretokens", total)
            words = count_pretokens(paths, lambda n: bar.advance(task, n))
            task = bar.add("learning merges", vocab_size - FIRST_MERGE_ID)
            base = [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIAL_TOKENS]
            merges = learn_merges(
                words, vocab_size - FIRST_MERGE_ID, base, lambda: bar.advance(task, 1)
            )
        return cls(merges)

    # ------------------------------------------------------------ files

    def to_json(self) -> str:
        """The canonical JSON that `save` writes and `sha256` hashes."""
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "pattern": GPT2_PATTERN,
            "special": SPECIAL_TOKENS,
            "vocab_size": self.vocab_size,
            "merges": self.merges.tolist(),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def save(self, path: str | Path) -> None:
        """Write the canonical JSON (sha256sum of the file equals self.sha256)."""
        _write(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a file written by save; EulerError naming the file (and field) if it is
        missing, corrupt or foreign."""
        path = Path(path)
        return cls._from_doc(read_json(path, "tokenizer file"), str(path))

    @classmethod
    def loads(cls, text: str, where: str) -> Tokenizer:
        """Parse the JSON text that save writes (e.g. a checkpoint's embedded copy);
        errors name `where`."""
        return cls._from_doc(parse_json(text, where), where)

    @classmethod
    def _from_doc(cls, doc: object, where: str) -> Tokenizer:
        """A Tokenizer from a parsed document, every field checked against ours."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = describe(doc.get("format", MISSING) if isinstance(doc, dict) else doc)
            raise EulerError(
                f"{where}: not a NanoEuler tokenizer (format: expected {FORMAT!r}, found {found})"
            )
        f = Fields(doc, where)
        f.only(("format", "version", "pattern", "special", "vocab_size", "merges"))
        if f.int("version") != VERSION:
            f.fail("version", f"{VERSION} (the version this code reads)", doc["version"])
        if f.str("pattern") != GPT2_PATTERN:
            f.fail("pattern", "the GPT-2 pretokenizer pattern", doc["pattern"])
        if f.get("special") != SPECIAL_TOKENS:
            f.fail("special", f"the special tokens {SPECIAL_TOKENS}", doc["special"])
        vocab_size = f.int("vocab_size", lo=FIRST_MERGE_ID, hi=MAX_VOCAB_SIZE)
        merges = f.list("merges")
        if len(merges) != vocab_size - FIRST_MERGE_ID:
            f.fail("vocab_size", f"{FIRST_MERGE_ID} + {len(merges)} merges", vocab_size)
        for r, m in enumerate(merges):
            if not _is_pair(m) or not (_is_plain(m[0], r) and _is_plain(m[1], r)):
                raise EulerError(
                    f"{where}: merges[{r}]: expected a pair of ids of bytes (0..255) or earlier "
                    f"merges ({FIRST_MERGE_ID}..{FIRST_MERGE_ID + r - 1}), found {m!r:.40}"
                )
        try:
            return cls(merges)
        except ValueError as e:
            raise EulerError(f"{where}: merges: {e}") from None

    def to_hf_json(self) -> str:
        """Hugging Face tokenizer.json (ByteLevel BPE) that gives the same ids as encode
        with allow_special=True (the `tokenizers` library always matches added tokens)."""
        return hf_tokenizer_json(self._vocab, self.merges.tolist(), SPECIAL_TOKENS)

    def export_hf(self, path: str | Path) -> None:
        """Write to_hf_json() to path."""
        _write(Path(path), self.to_hf_json())

    # ------------------------------------------------------------ encoding

    def encode(self, text: str, allow_special: bool = False) -> np.ndarray:
        """int32[T] token ids of text. Special-token text is plain text unless allow_special."""
        return self.encode_batch([text], allow_special=allow_special, threads=1)[0]

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """int32[T] token ids of raw bytes (not necessarily UTF-8); no special tokens."""
        return self._encode_parts([[bytes(data)]], threads=1)[0]

    def encode_batch(
        self, texts: Sequence[str], allow_special: bool = False, threads: int | None = None
    ) -> list[np.ndarray]:
        """encode() of each text, spread over `threads` threads (default: every core).

        Texts are cut between threads at document ends or at pretoken boundaries that do
        not depend on context, so the ids equal those of encoding each text alone.
        """
        parts = [_split_special(t, allow_special) for t in texts]
        return self._encode_parts(parts, threads or os.cpu_count() or 1)

    def _encode_parts(self, parts: list[list[bytes | int]], threads: int) -> list[np.ndarray]:
        """For each document, a list of byte strings and special ids -> one int32 array."""
        chunks = [p for doc in parts for p in doc if isinstance(p, bytes)]
        buf = np.frombuffer(b"".join(chunks), np.uint8)
        ends = np.array([0, *accumulate(map(len, chunks))], np.int64)
        threads = max(1, min(threads, buf.size // _PARALLEL_MIN_BYTES))
        with self._lock:
            while len(self._caches) < threads:
                self._caches.append(new_table(_CACHE_ENTRIES, _CACHE_KEY_BYTES, _CACHE_IDS))
            if threads == 1:
                ids, at = self._encode_spans(buf, 0, ends)
            else:
                ids, at = self._encode_threads(buf, ends, threads)
        at = at.tolist()  # token offset of each chunk end
        pieces = iter([ids[a:b] for a, b in zip(at[:-1], at[1:], strict=True)])
        out = []
        for doc in parts:  # each document's arrays are views of `ids` unless specials join in
            if len(doc) == 1 and isinstance(doc[0], bytes):
                out.append(next(pieces))
            else:
                arrays = [
                    next(pieces) if isinstance(p, bytes) else np.array([p], np.int32) for p in doc
                ]
                out.append(np.concatenate(arrays) if arrays else np.zeros(0, np.int32))
        return out

    def _encode_threads(self, buf: np.ndarray, ends: np.ndarray, threads: int):
        """_encode_spans over the spans between `ends`, cut further into one part per thread
        (at a span end or a context-free pretoken boundary); the same (ids, offsets)."""
        cuts = _thread_cuts(buf, ends, threads)
        bounds = np.union1d(ends, cuts)
        jobs = [
            (w, bounds[np.searchsorted(bounds, lo) : np.searchsorted(bounds, hi) + 1])
            for w, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True))
        ]
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: self._encode_spans(buf, *job), jobs))
        ids = np.concatenate([r[0] for r in results])
        # Token offset of every bound: each worker's own offsets, shifted past the workers before.
        shift = np.cumsum([0] + [r[0].size for r in results])
        tok_at = np.concatenate(
            [[0]] + [r[1][1:] + s for r, s in zip(results, shift[:-1], strict=True)]
        )
        return ids, tok_at[np.searchsorted(bounds, ends)]

    def _encode_spans(self, buf: np.ndarray, worker: int, bounds: np.ndarray):
        """(ids int32[T], offsets int64[S+1]) of the spans between consecutive bounds."""
        lo, hi = int(bounds[0]), int(bounds[-1])
        out = np.empty(hi - lo, np.int32)
        out_starts = np.empty(bounds.size, np.int64)
        encode_spans(
            buf,
            bounds,
            char_classes(),
            self._keys,
            self._ranks,
            FIRST_MERGE_ID,
            self._caches[worker],
            out,
            out_starts,
        )
        return out[: out_starts[-1]], out_starts

    # ------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """The bytes of a sequence of ids (a special token gives its text)."""
        ids = np.asarray(ids, np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise EulerError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        vocab = self._vocab
        return b"".join([vocab[i] for i in ids.tolist()])

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of a sequence of ids; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _write(path: Path, text: str) -> None:
    """Write text to a temporary file beside path, then rename it: never half a file."""
    from euler.data.files import default_mode  # euler.data imports this module

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise EulerError(f"cannot write {path}: {e.strerror}") from None


def _is_pair(m: object) -> bool:
    return isinstance(m, list) and len(m) == 2 and all(type(x) is int for x in m)


def _is_plain(i: int, rank: int) -> bool:
    """i names a byte or an earlier merge (never a special token) at merge `rank`."""
    return 0 <= i < 256 or FIRST_MERGE_ID <= i < FIRST_MERGE_ID + rank


def _vocab_bytes(merges: np.ndarray) -> list[bytes]:
    """id -> bytes; ValueError if two tokens would have the same bytes."""
    vocab = [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIAL_TOKENS]
    known = set(vocab)
    for r, (a, b) in enumerate(merges.tolist()):
        joined = vocab[a] + vocab[b]
        if joined in known:
            raise ValueError(f"merge {r} remakes an existing token {joined!r}")
        known.add(joined)
        vocab.append(joined)
    return vocab


def _split_special(text: str, allow_special: bool) -> list[bytes | int]:
    """text as UTF-8 pieces, with special-token text turned into ids if allow_special."""
    if not allow_special:
        return [utf8(text)]
    parts: list[bytes | int] = []
    for k, piece in enumerate(_SPECIAL_SPLIT.split(text)):
        if k % 2:
            parts.append(SPECIAL_TOKENS[piece])
        elif piece:
            parts.append(utf8(piece))
    return parts


def _thread_cuts(buf: np.ndarray, ends: np.ndarray, threads: int) -> np.ndarray:
    """Byte offsets 0 = c0 < c1 < ... = len(buf) splitting buf into about equal parts for
    threads, each cut at a document end or a context-free pretoken boundary."""
    n = buf.size
    cuts = [0]
    for t in range(1, threads):
        p = max(t * n // threads, cuts[-1] + 1)
        doc_end = int(ends[np.searchsorted(ends, p)])
        found = safe_cuts(buf, p, min(doc_end - 1, p + _CUT_SEARCH_BYTES))
        cut = int(found[0]) if found.size else doc_end
        if cut < n and cut > cuts[-1]:
            cuts.append(cut)
    cuts.append(n)
    return np.asarray(cuts, np.int64)


class _Progress:
    """A rich progress bar, or nothing when disabled."""

    def __init__(self, enabled: bool):
        self._bar = None
        if enabled:
            from rich.progress import Progress

            self._bar = Progress()

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def add(self, what: str, total: int):
        return self._bar.add_task(what, total=total) if self._bar is not None else None

    def advance(self, task, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(task, n)
