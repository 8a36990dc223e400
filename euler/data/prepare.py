"""Pretraining preparation: documents -> token shards + manifest, split by document.

Layout of a prepared folder:

    manifest.json                 what is here (see manifest.py); written last
    tokenizer.json                the tokenizer that made the shards
    <source>-<split>-<NNN>.bin    token shards (shards.py), split = train | val

Each document is written as <|endoftext|> followed by its tokens, so every
document (the first too) is preceded by the separator, as in GPT-2's data.

Split rule: a document goes to validation iff the first 8 bytes of
BLAKE2b(seed, document text), read as a fraction of 2^64, are below val_fraction.
It depends only on the seed and the text, not on the order of the inputs, and the
same text always lands on the same side.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from euler.data.corpus import CorpusSource
from euler.data.files import staged_dir
from euler.data.manifest import write_manifest
from euler.data.shards import ShardWriter, token_dtype
from euler.errors import EulerError

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
SHARD_TOKENS = 100_000_000  # tokens per shard before a new file is started
BATCH_CHARS = 4 << 20  # text gathered before one encode_batch call
SAMPLE_CHARS_PER_DOC = 64_000  # at most this much of one document goes to tokenizer training
SPLIT_RULE = "val iff blake2b(seed:8 bytes LE + utf8 text)[:8] / 2**64 < val_fraction"


def is_val(text: str, seed: int, val_fraction: float) -> bool:
    """The document split rule (see module docstring)."""
    h = hashlib.blake2b(seed.to_bytes(8, "little") + text.encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little") / 2**64 < val_fraction


def encode_stream(
    tok: Tokenizer, docs: Iterable[str], threads: int
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (document, int32 ids) in order; batches go through encode_batch on `threads`."""
    batch: list[str] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= BATCH_CHARS:
            yield from zip(batch, tok.encode_batch(batch, threads=threads), strict=True)
            batch, size = [], 0
    if batch:
        yield from zip(batch, tok.encode_batch(batch, threads=threads), strict=True)


def empty_source(src: CorpusSource) -> EulerError:
    """The error for a source with no document: it names the user's files (never a file of
    ours), and what cleaning drops."""
    names = [str(i.get("origin") or i.get("path")) for i in src.inputs]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    why = {
        "books": "an empty file, or only a Project Gutenberg header and footer",
        "web": "no non-empty text in its text column, or articles with a title only",
    }.get(src.name, "nothing but whitespace")
    return EulerError(
        f"empty corpus: source {src.name!r} has no document left after cleaning "
        f"({shown or 'no files'}: {why})"
    )


def train_tokenizer(
    sources: list[CorpusSource], vocab_size: int, workdir: Path, sample_chars: int
) -> Tokenizer:
    """Train a BPE tokenizer on an even sample of the sources' cleaned text.

    Each source contributes up to sample_chars / len(sources) characters, at most
    SAMPLE_CHARS_PER_DOC from any one document, so that no single book dominates.
    """
    from euler.tokenizer import Tokenizer

    budget = sample_chars // len(sources)
    sample = workdir / "tokenizer-sample.txt"
    with open(sample, "w", encoding="utf-8") as f:
        for src in sources:
            left, seen = budget, False
            for doc in src.documents():
                seen = True
                piece = doc[: min(SAMPLE_CHARS_PER_DOC, left)]
                f.write(piece + "\n\n")
                left -= len(piece)
                if left <= 0:
                    break
            if not seen:  # not one document: say so by the user's files, not the sample's
                raise empty_source(src)
    tok = Tokenizer.train([str(sample)], vocab_size, progress=False)
    sample.unlink()
    return tok


def prepare_corpus(
    sources: list[CorpusSource],
    out_dir: Path,
    tokenizer: Tokenizer | None = None,
    vocab_size: int | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
    threads: int | None = None,
    tokenizer_sample_chars: int = 20_000_000,
    shard_tokens: int = SHARD_TOKENS,
    log: Callable[[str], None] = lambda _: None,
    overwrite: bool = False,
    reads: Iterable[Path] = (),
) -> dict:
    """Tokenize `sources` into shards in `out_dir` and return the manifest written there.

    Give a tokenizer, or vocab_size to train one on the sources first. The folder is
    built under a temporary name and swapped into place only when complete; an earlier
    preparation there is replaced only with `overwrite`, and never when it holds one of
    the sources' input files or `reads` (e.g. the tokenizer file given).
    """
    if not sources:
        raise EulerError("no data sources given")
    if not 0.0 <= val_fraction < 1.0:
        raise EulerError(f"val fraction must be in [0, 1), got {val_fraction}")
    weights = [s.weight for s in sources]
    if any(w is None for w in weights) and any(w is not None for w in weights):
        raise EulerError("give a weight to every source or to none (then tokens decide)")
    if any(w is not None and not w > 0 for w in weights):
        raise EulerError(f"source weights must be positive, got {weights}")
    if (tokenizer is None) == (vocab_size is None):
        raise EulerError("give either a tokenizer file or a vocabulary size to train one")
    threads = threads or os.cpu_count() or 1
    inputs = [Path(i["path"]) for src in sources for i in src.inputs if "path" in i]
    with staged_dir(Path(out_dir), overwrite, [*inputs, *reads]) as work:
        t_tok = None  # seconds spent training the tokenizer, when we trained it
        if tokenizer is None:
            log(f"training a {vocab_size}-token BPE tokenizer on the sources")
            t0 = time.perf_counter()
            tokenizer = train_tokenizer(sources, vocab_size, work, tokenizer_sample_chars)
            t_tok = round(time.perf_counter() - t0, 3)
        (work / TOKENIZER_FILE).write_text(tokenizer.to_json(), encoding="utf-8")
        t1 = time.perf_counter()
        entries = [
            _write_source(src, work, tokenizer, val_fraction, seed, threads, shard_tokens, log)
            for src in sources
        ]
        seconds = time.perf_counter() - t1
        total = {s: sum(e["tokens"][s] for e in entries) for s in SPLITS}
        docs = sum(e["documents"][s] for e in entries for s in SPLITS)
        if val_fraction > 0 and total["val"] == 0:  # training would fail at its first eval
            raise EulerError(
                f"--val-fraction {val_fraction:g}: the validation split is empty "
                f"({_documents(docs)} in all; a hash of each document's text decides its "
                "split): give more documents, a larger --val-fraction or another --seed"
            )
        if total["train"] == 0:
            raise EulerError(f"the training split is empty ({_documents(docs)} in all)")
        text_bytes = sum(e["text_bytes"][s] for e in entries for s in SPLITS)
        manifest = {
            "kind": "pretrain",
            "tokenizer": {
                "file": TOKENIZER_FILE,
                "sha256": tokenizer.sha256,
                "vocab_size": tokenizer.vocab_size,
                "eot_id": tokenizer.eot_id,
                "train_seconds": t_tok,
            },
            "split": {"val_fraction": val_fraction, "seed": seed, "rule": SPLIT_RULE},
            "sources": entries,
            "totals": {
                "tokens": total,
                "text_bytes": text_bytes,
                "val_token_fraction": total["val"] / (total["train"] + total["val"]),
                "bytes_per_token": text_bytes / (total["train"] + total["val"]),
                "seconds": round(seconds, 3),
                "mb_per_s": text_bytes / 1e6 / seconds if seconds > 0 else None,
                "threads": threads,
            },
        }
        shards = [name for e in entries for split in SPLITS for name in e["shards"][split]]
        write_manifest(work, manifest, shards)
    return manifest


def _documents(n: int) -> str:
    """'1 document', '30 documents'."""
    return "1 document" if n == 1 else f"{n} documents"


def _write_source(
    src: CorpusSource,
    work: Path,
    tok: Tokenizer,
    val_fraction: float,
    seed: int,
    threads: int,
    shard_tokens: int,
    log: Callable[[str], None],
) -> dict:
    """Tokenize one source into its train/val shards; return its manifest entry."""
    dtype = token_dtype(tok.vocab_size)
    eot = np.array([tok.eot_id], dtype=np.int32)
    writers: dict[str, ShardWriter | None] = dict.fromkeys(SPLITS)
    shards: dict[str, list[str]] = {s: [] for s in SPLITS}
    docs = dict.fromkeys(SPLITS, 0)
    tokens = dict.fromkeys(SPLITS, 0)
    text_bytes = dict.fromkeys(SPLITS, 0)
    try:
        for text, ids in encode_stream(tok, src.documents(), threads):
            split = "val" if is_val(text, seed, val_fraction) else "train"
            w = writers[split]
            if w is None or w.count >= shard_tokens:
                if w is not None:
                    w.close()
                name = f"{src.name}-{split}-{len(shards[split]):03d}.bin"
                shards[split].append(name)
                w = writers[split] = ShardWriter(work / name, tok.vocab_size, dtype)
            w.write(eot)
            w.write(ids)
            docs[split] += 1
            tokens[split] += 1 + len(ids)
            text_bytes[split] += len(text.encode("utf-8"))
        for w in writers.values():
            if w is not None:
                w.close()
    except BaseException:
        for w in writers.values():
            if w is not None:
                w.abort()
        raise
    if docs["train"] + docs["val"] == 0:
        raise empty_source(src)
    log(
        f"{src.name}: {docs['train'] + docs['val']} documents, "
        f"{tokens['train']:,} train + {tokens['val']:,} val tokens"
    )
    return {
        "name": src.name,
        "weight": src.weight,
        "inputs": src.inputs,
        "documents": docs,
        "tokens": tokens,
        "text_bytes": text_bytes,
        "shards": shards,
    }
