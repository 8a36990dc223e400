"""Bits per byte of a model on text: comparable across tokenizers and with the trainer.

Scoring rule. A source is one `--text` path: a text file or a folder of them (one book,
Project Gutenberg header and footer stripped, is one document), WikiExtractor files (one
article per document), JSON Lines or Parquet with a text column, read as `euler data
prepare` reads them; or a folder prepared by `euler data prepare`, whose held-out (val)
split is scored source by source, exactly the token stream the trainer's validation
loss draws from. Every document is encoded with the checkpoint's tokenizer and preceded
by <|endoftext|>, and a source's documents are concatenated in order. The stream is cut
into consecutive windows of T + 1 tokens that overlap by one (stride T, T = the model's
context): each token after the first is predicted once, by head 0, from the tokens before
it in its window (0 to T - 1 of them), the last window being shorter. So the mean loss is
the expectation of the trainer's head-0 validation loss, whose windows start anywhere.

    bits per byte = sum of head-0 cross-entropies (nats) / ln 2 / UTF-8 bytes of the documents

which is nats per token / ln 2 x tokens per byte: the tokenizer's compression cancels, so
models with different tokenizers compare. The separators are predicted and scored, their
bytes not counted (a tokenizer-independent convention: one boundary per document).

Beside that headline, labelled as such: the mean over the MTP heads of each head's loss
per token in the same windows (head k predicting the token k + 1 places ahead, within its
window), the counterpart of the trainer's objective.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from euler.errors import EulerError

EVAL_BATCH = 16  # windows per forward, at most
# tokens per forward, at most: a forward keeps every layer's activations (SmolLM2-135M: 1.25
# MB a token, 41 GB for 16 windows of 2,048), so a long context scores fewer windows at once
EVAL_TOKENS = 8192


@dataclass
class Stream:
    """One source's tokens to score: streams (each scored apart) and their text's bytes."""

    name: str
    streams: list[np.ndarray]
    text_bytes: int
    documents: int


def text_streams(path: Path, tok) -> list[Stream]:
    """The sources of one --text path: one for a file or folder of documents, one per
    corpus source for a prepared data folder (its val split)."""
    path = Path(path)
    if not path.exists():
        raise EulerError(f"--text: {path} not found")
    if path.is_dir() and (path / "manifest.json").is_file():
        return _prepared_streams(path, tok)
    from euler.data.corpus import file_source

    txt = path.suffix == ".txt" or (path.is_dir() and any(path.rglob("*.txt")))
    src = file_source("books" if txt else "web", [str(path)], progress=False)
    return [_encoded(str(path), src.documents(), tok)]


def _encoded(name: str, docs: Iterator[str], tok) -> Stream:
    """Stream of documents: each preceded by <|endoftext|>, concatenated."""
    from euler.data.prepare import encode_stream

    parts, n_bytes, n_docs = [], 0, 0
    eot = np.array([tok.eot_id], dtype=np.int32)
    for text, ids in encode_stream(tok, docs, threads=os.cpu_count() or 1):
        parts += [eot, ids.astype(np.int32)]
        n_bytes += len(text.encode("utf-8"))
        n_docs += 1
    if not n_docs:
        raise EulerError(f"--text: {name}: no document to score (empty files or folder)")
    return Stream(name, [np.concatenate(parts)], n_bytes, n_docs)


def _prepared_streams(folder: Path, tok) -> list[Stream]:
    """The val split of a prepared folder, per source: its shards as they are when the
    tokenizer is the checkpoint's, else their documents decoded and encoded again."""
    from euler.data.manifest import folder_tokenizer, read_manifest

    m = read_manifest(folder, kind="pretrain")
    V = m["tokenizer"]["vocab_size"]
    same = m["tokenizer"]["sha256"] == tok.sha256
    folder_tok = folder_tokenizer(folder, m)  # checked whole, as train checks it
    out = []
    for src in m["sources"]:
        name = f"{folder}:{src['name']} (val)"
        shards = [_checked_shard(folder / f, m, V) for f in src["shards"]["val"]]
        if not src["documents"]["val"]:
            continue  # a source too small to hold a document out
        if same:
            out.append(Stream(name, shards, src["text_bytes"]["val"], src["documents"]["val"]))
        else:
            docs = (doc for s in shards for doc in _split_documents(s, folder_tok))
            out.append(_encoded(name, docs, tok))
    if not out:
        raise EulerError(f"--text: {folder}: its val split holds no document")
    return out


def _checked_shard(path: Path, m: dict, V: int) -> np.ndarray:
    """A val shard of a prepared folder, checked as training checks it: its size and
    sampled checksum against the manifest, every id inside the vocabulary."""
    from euler.data.checksums import check_sample
    from euler.data.shards import first_out_of_range, open_shard, token_dtype

    shard = open_shard(path, V, token_dtype(V)().itemsize)
    check_sample(path, m["files"][path.name])
    bad = first_out_of_range(shard, V)
    if bad >= 0:
        raise EulerError(
            f"--text: {path}: position {bad}: token id {int(shard[bad])} is outside the "
            f"vocabulary (0..{V - 1}); run `euler data verify`"
        )
    return np.asarray(shard, dtype=np.int32)


def _split_documents(shard: np.ndarray, tok) -> Iterator[str]:
    """The documents of a shard (each after an <|endoftext|>) as text."""
    starts = np.flatnonzero(shard == tok.eot_id)
    for a, b in zip(starts, [*starts[1:], len(shard)], strict=True):
        yield tok.decode_bytes(shard[a + 1 : b]).decode("utf-8")


def window_starts(n_tokens: int, T: int) -> range:
    """First positions of the windows of T + 1 tokens at stride T over n_tokens tokens:
    every token after the first is a target exactly once (the last window shorter)."""
    return range(0, max(n_tokens - 1, 0), T)


def score_stream(
    model,
    stream: np.ndarray,
    T: int,
    on_batch: Callable[[int], None] | None = None,
    max_tokens: int = EVAL_TOKENS,
) -> tuple[np.ndarray, np.ndarray]:
    """Per head k: (sum of its cross-entropies in nats, number of tokens it predicted), two
    (K,) arrays, over one stream in windows of T + 1 tokens at stride T, EVAL_BATCH windows
    per forward of `model` but at most max_tokens // T (at least one); on_batch(windows)
    after each forward. Head 0 (next token) predicts every token after the first once; head
    k the tokens k + 1 places ahead within a window."""
    from euler.model.transformer import make_targets

    B, K = max(1, min(EVAL_BATCH, max_tokens // T)), model.cfg.n_mtp
    starts = list(window_starts(len(stream), T))
    total, count = np.zeros(K), np.zeros(K, np.int64)
    for i in range(0, len(starts), B):
        window = np.zeros((B, T + 1), dtype=np.int32)
        valid = np.zeros((B, T + 1), dtype=np.uint8)
        for b, s in enumerate(starts[i : i + B]):
            piece = stream[s : s + T + 1]
            window[b, : len(piece)], valid[b, : len(piece)] = piece, 1
        targets = make_targets(window, T, K, valid)  # (K, B, T)
        model.forward(window[:, :T], targets, need_grad=False)
        losses = model.be.to_host(model.acts.losses).astype(np.float64).reshape(K, B, T)
        keep = targets >= 0
        total += np.where(keep, losses, 0.0).sum(axis=(1, 2))
        count += keep.sum(axis=(1, 2))
        if on_batch:
            on_batch(len(starts[i : i + B]))
    return total, count


def load_text(paths: list[Path], ck, max_tokens: int = 0) -> list[Stream]:
    """The sources of every --text path, encoded with checkpoint ck's tokenizer; with
    max_tokens, each cut to its first max_tokens tokens (first_tokens)."""
    tok = ck.tokenizer()
    if tok.vocab_size > ck.cfg.vocab_size:
        raise EulerError(
            f"{ck.path}: its tokenizer has {tok.vocab_size} tokens but the model only "
            f"{ck.cfg.vocab_size}: the checkpoint cannot score text"
        )
    sources = [s for p in paths for s in text_streams(p, tok)]
    return [first_tokens(s, max_tokens, tok) for s in sources] if max_tokens else sources


def first_tokens(src: Stream, n: int, tok) -> Stream:
    """The source cut to its first n tokens (n - 1 targets and more, as a stream scores
    apart), its bytes and documents counted over what is kept (a document cut short counts
    as one); a source of at most n tokens is returned whole. A timed budget (euler pipeline)
    scores such a prefix: a few books are millions of tokens."""
    kept, left = [], n
    for stream in src.streams:
        if left < 2:  # a stream of one token predicts nothing
            break
        kept.append(stream[:left])
        left -= len(kept[-1])
    if sum(map(len, kept)) == sum(map(len, src.streams)):
        return src
    ids = np.concatenate(kept)
    eot = ids == tok.eot_id  # the separators: predicted and scored, their bytes not counted
    n_bytes = len(tok.decode_bytes(ids[~eot]))
    documents = max(1, int(eot.sum()))
    return Stream(f"{src.name}, first {sum(map(len, kept)):,} tokens", kept, n_bytes, documents)


def n_windows(sources: list[Stream], T: int) -> int:
    """How many windows of stride T score `sources` (a progress bar's total)."""
    return sum(len(window_starts(len(s), T)) for src in sources for s in src.streams)


def evaluate_text(
    ck,
    sources: list[Stream],
    backend,
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
    max_tokens: int = EVAL_TOKENS,
) -> dict:
    """Bits per byte of checkpoint ck on each source and overall (the module's rule);
    on_batch(windows) after each forward of at most max_tokens tokens (score_stream)."""
    from euler.model.transformer import Model

    T = ck.cfg.context
    model = Model(ck.cfg, backend, flat_params=ck.params, precision=precision)
    K = ck.cfg.n_mtp
    rows, nats, tokens, n_bytes = [], np.zeros(K), np.zeros(K, np.int64), 0
    for src in sources:
        s_nats, s_tokens = np.zeros(K), np.zeros(K, np.int64)
        for stream in src.streams:
            a, b = score_stream(model, stream, T, on_batch, max_tokens)
            s_nats, s_tokens = s_nats + a, s_tokens + b
        rows.append(_row(src.name, s_nats, s_tokens, src.text_bytes, src.documents))
        nats, tokens, n_bytes = nats + s_nats, tokens + s_tokens, n_bytes + src.text_bytes
    return {
        "checkpoint": str(ck.path),
        "context": T,
        "mtp_heads": K,
        "rule": "documents after <|endoftext|>, concatenated per source; windows of T + 1 "
        "tokens at stride T; head 0 (next token); bits per byte = nats / ln 2 / UTF-8 bytes; "
        "beside it the mean over the MTP heads of each head's nats per token",
        "sources": rows,
        "overall": _row("overall", nats, tokens, n_bytes, sum(s.documents for s in sources)),
    }


def _row(name: str, nats: np.ndarray, tokens: np.ndarray, n_bytes: int, documents: int) -> dict:
    """One table row from per-head sums (K,): head 0's loss per token, tokens per byte and
    bits per byte (the headline); the MTP heads' mean loss per token beside them (heads
    that predicted nothing, in a source shorter than their reach, left out)."""
    per_head = [float(n / t) for n, t in zip(nats, tokens, strict=True) if t]
    head0, t0 = float(nats[0]), int(tokens[0])
    return {
        "source": name,
        "documents": documents,
        "tokens": t0,
        "bytes": n_bytes,
        "nats_per_token": head0 / t0 if t0 else float("nan"),
        "tokens_per_byte": t0 / n_bytes if n_bytes else float("nan"),
        "bits_per_byte": head0 / math.log(2) / n_bytes if n_bytes else float("nan"),
        "nats_per_token_mtp_mean": float(np.mean(per_head)) if per_head else float("nan"),
    }
