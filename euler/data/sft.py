"""SFT data: Alpaca records -> chat-template token sequences with a loss mask.

Too-long rule (C = the context given to prepare, default 128): a record's sequence
is prompt (P tokens, ending with <|assistant|>) + response + <|end|>. Positions
1..C are the head-0 targets of a C-token window, so
  - a record whose prompt alone exceeds the context (P > C) is dropped: not one
    response token could be learned;
  - otherwise the sequence is cut to its first C + 1 tokens (the response loses its
    tail and, then, its closing <|end|>), counted as truncated.
Prepared folder: manifest.json (kind "sft"), tokenizer.json and per split
sft-<split>.tokens.bin, sft-<split>.mask.bin (uint8) and sft-<split>.offsets.bin
(uint64, records + 1 entries: record i is tokens[offsets[i]:offsets[i+1]]).
Training on it needs a model context of at least C (SFTDataset's `context`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from euler.data.chat_template import prompt_ids, prompt_text, render, response_ids
from euler.data.checksums import check_sample
from euler.data.download import download
from euler.data.files import check_output, sha256_file, staged_dir
from euler.data.manifest import MAX_CONTEXT, SFT_FILES, read_manifest, sft_file, write_manifest
from euler.data.prepare import SPLITS, TOKENIZER_FILE, is_val
from euler.data.shards import first_out_of_range, open_shard, token_dtype, write_shard
from euler.errors import EulerError
from euler.schema import MISSING, Fields, describe, read_json

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

FIELDS = ("instruction", "input", "output")
TOO_LONG_RULE = "drop if the prompt alone exceeds the context (P > C), else cut to C + 1 tokens"


def load_alpaca(path: Path) -> list[dict]:
    """Records of an Alpaca JSON file (a list of {instruction, input, output}), checked.

    Raises EulerError naming the file and line of invalid JSON, or the record index
    and field of a record that lacks a field or holds a non-string.
    """
    path = Path(path)
    if not path.is_file():
        raise EulerError(f"instruction file not found: {path}")
    data = read_json(path, "instruction file")
    if not isinstance(data, list):
        raise EulerError(f"{path}: expected a JSON list of records, found {describe(data)}")
    records = []
    for i, value in enumerate(data):
        if not isinstance(value, dict):
            raise EulerError(f"{path}: [{i}]: expected a record object, found {describe(value)}")
        rec = Fields(value, str(path), f"[{i}]")
        records.append({k: rec.str(k, default="" if k == "input" else MISSING) for k in FIELDS})
    return records


def prepare_sft(
    items: list[str],
    out_dir: Path,
    tokenizer: Tokenizer,
    context: int = 128,
    val_fraction: float = 0.05,
    seed: int = 0,
    threads: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    reads: Iterable[Path] = (),
) -> dict:
    """Render Alpaca files/URLs into SFT shards in `out_dir`; return the manifest.

    An earlier preparation in `out_dir` is replaced only with `overwrite`, and never when
    it holds an instruction file or one of `reads` (e.g. the tokenizer file).
    """
    if not 1 <= context <= MAX_CONTEXT:
        raise EulerError(f"context must be in [1, {MAX_CONTEXT}], got {context}")
    if not items:
        raise EulerError("no instruction files given")
    if not 0.0 <= val_fraction < 1.0:
        raise EulerError(f"val fraction must be in [0, 1), got {val_fraction}")
    reads = [*reads, *(Path(i) for i in items if not i.startswith(("http://", "https://")))]
    check_output(Path(out_dir), overwrite, reads)  # before any download or encoding
    threads = threads or os.cpu_count() or 1
    t0 = time.perf_counter()
    inputs, records = [], []
    for item in items:
        path = (
            download(item, progress=progress)
            if item.startswith(("http://", "https://"))
            else Path(item)
        )
        recs = load_alpaca(path)
        records += recs
        inputs.append(
            {
                "origin": item,
                "path": str(path),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
                "records": len(recs),
            }
        )
    if not records:
        raise EulerError("no instruction records in the given files")
    prompts = tokenizer.encode_batch(
        [prompt_text(r["instruction"], r["input"]) for r in records], threads=threads
    )
    responses = tokenizer.encode_batch([r["output"].strip() for r in records], threads=threads)

    stats = {
        s: {"kept": 0, "truncated": 0, "dropped": 0, "tokens": 0, "loss_tokens": 0} for s in SPLITS
    }
    seqs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in SPLITS}
    for rec, p_tok, r_tok in zip(records, prompts, responses, strict=True):
        split = "val" if is_val(render(**rec), seed, val_fraction) else "train"
        p, r = prompt_ids(tokenizer, p_tok), response_ids(tokenizer, r_tok)
        st = stats[split]
        if len(p) > context:
            st["dropped"] += 1
            continue
        ids = np.concatenate([p, r])
        mask = np.concatenate([np.zeros(len(p), np.uint8), np.ones(len(r), np.uint8)])
        if len(ids) > context + 1:
            ids, mask = ids[: context + 1], mask[: context + 1]
            st["truncated"] += 1
        st["kept"] += 1
        st["tokens"] += len(ids)
        st["loss_tokens"] += int(mask.sum())
        seqs[split].append((ids, mask))

    if not seqs["train"]:
        raise EulerError(f"no record fits a context of {context} tokens")
    V = tokenizer.vocab_size
    with staged_dir(Path(out_dir), overwrite, reads) as work:
        (work / TOKENIZER_FILE).write_text(tokenizer.to_json(), encoding="utf-8")
        for split in SPLITS:
            pairs = seqs[split]
            lengths = np.array([len(ids) for ids, _ in pairs], dtype=np.uint64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
            ids = np.concatenate([i for i, _ in pairs]) if pairs else np.zeros(0, np.int32)
            mask = np.concatenate([m for _, m in pairs]) if pairs else np.zeros(0, np.uint8)
            write_shard(work / sft_file(split, "tokens"), ids, V, token_dtype(V))
            write_shard(work / sft_file(split, "mask"), mask, V, np.uint8)
            write_shard(work / sft_file(split, "offsets"), offsets, V, np.uint64)
            st = stats[split]
            st["loss_fraction_of_record_tokens"] = st["loss_tokens"] / max(st["tokens"], 1)
            st["loss_fraction_of_windows"] = st["loss_tokens"] / max(st["kept"] * (context + 1), 1)
        manifest = {
            "kind": "sft",
            "tokenizer": {
                "file": TOKENIZER_FILE,
                "sha256": tokenizer.sha256,
                "vocab_size": V,
                "eot_id": tokenizer.eot_id,
            },
            "context": context,
            "too_long_rule": TOO_LONG_RULE,
            "split": {"val_fraction": val_fraction, "seed": seed},
            "inputs": inputs,
            "records": len(records),
            "splits": stats,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_manifest(work, manifest, [sft_file(s, w) for s in SPLITS for w in SFT_FILES])
    return manifest


class SFTDataset:
    """Rendered SFT records of one split; batches of (tokens, mask) windows.

    Row b of a batch is one record placed at position 0, cut to T+K tokens and padded
    with <|endoftext|>; mask[b, j] = 1 iff token j is a response token or the
    response's closing <|end|>. The target of head k at position t is
    tokens[b, t+1+k] and counts iff mask[b, t+1+k] = 1.
    """

    def __init__(
        self,
        folder: str | Path,
        split: str = "train",
        vocab_size: int | None = None,
        context: int | None = None,
    ) -> None:
        """Open one split of a prepared SFT folder, checked: the manifest, each shard's
        size and sampled checksum, element sizes, token ids below V, offsets rising from
        0 to the number of tokens, and a mask of 0/1 as long as the tokens.

        context: the model's context T; data prepared for a longer one is refused (its
        records would be cut at T + K without a word), here or else at the first batch.
        """
        if split not in SPLITS:
            raise EulerError(f"split must be 'train' or 'val', got {split!r}")
        folder = Path(folder)
        self.manifest = m = read_manifest(folder, kind="sft")
        self.folder = folder
        if context is not None:
            self.check_context(context)
        V = m["tokenizer"]["vocab_size"]
        if vocab_size is not None and vocab_size != V:
            raise EulerError(
                f"{folder}: the SFT data was written for a vocabulary of {V} tokens, "
                f"but the tokenizer has {vocab_size}"
            )
        arrays = {}
        for what, size in (("tokens", token_dtype(V)().itemsize), ("mask", 1), ("offsets", 8)):
            path = folder / sft_file(split, what)
            arrays[what] = open_shard(path, V, size)  # a foreign file is named as such first
            check_sample(path, m["files"][path.name])
        self.tokens, self.mask = arrays["tokens"], arrays["mask"]
        self.offsets = _checked_offsets(folder / sft_file(split, "offsets"), arrays["offsets"],
                                        len(self.tokens), m["context"])  # fmt: skip
        if len(self.mask) != len(self.tokens):
            raise EulerError(
                f"{folder / sft_file(split, 'mask')}: {len(self.mask)} mask values for "
                f"{len(self.tokens)} tokens"
            )
        bad = first_out_of_range(self.mask, 2)
        if bad >= 0:
            raise EulerError(
                f"{folder / sft_file(split, 'mask')}: position {bad}: mask value "
                f"{int(self.mask[bad])}, expected 0 or 1"
            )
        bad = first_out_of_range(self.tokens, V)
        if bad >= 0:
            raise EulerError(
                f"{folder / sft_file(split, 'tokens')}: position {bad}: token id "
                f"{int(self.tokens[bad])} is outside the vocabulary (0..{V - 1})"
            )
        self.pad_id = int(m["tokenizer"]["eot_id"])

    def check_context(self, T: int) -> None:
        """Refuse data prepared for a context longer than the model's T."""
        if self.manifest["context"] > T:
            raise EulerError(
                f"{self.folder}: SFT data prepared for a context of {self.manifest['context']} "
                f"tokens is longer than the model's context of {T}; re-run prepare-sft with "
                f"--context {T}"
            )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _rows(self, index: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray]:
        """(len(index), W) int32 tokens and uint8 mask; index -1 gives a padding row."""
        tokens = np.full((len(index), W), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(index), W), dtype=np.uint8)
        for b, i in enumerate(index):
            if i < 0:
                continue
            lo, hi = self.offsets[i], min(self.offsets[i + 1], self.offsets[i] + W)
            tokens[b, : hi - lo] = self.tokens[lo:hi]
            mask[b, : hi - lo] = self.mask[lo:hi]
        return tokens, mask

    def batch(self, step: int, seed: int, B: int, T: int, K: int) -> tuple[np.ndarray, np.ndarray]:
        """(B, T+K) int32 tokens and (B, T+K) uint8 mask, records drawn from (seed, step) alone."""
        self.check_context(T)
        if len(self) == 0:
            raise EulerError("this SFT split holds no records")
        rng = np.random.default_rng([seed, step])
        return self._rows(rng.integers(0, len(self), size=B), T + K)

    def iter_sequential(self, B: int, T: int, K: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every record once, in order, B per batch; the last batch is filled with padding rows."""
        self.check_context(T)
        for start in range(0, len(self), B):
            index = np.arange(start, start + B)
            index[index >= len(self)] = -1
            yield self._rows(index, T + K)


def _checked_offsets(path: Path, raw: np.ndarray, n_tokens: int, context: int) -> np.ndarray:
    """The int64 record offsets, checked: 0 first, rising, n_tokens last, and no record
    longer than the C + 1 tokens that prepare keeps."""
    if len(raw) == 0:
        raise EulerError(f"{path}: no offsets (a split of R records has R + 1)")
    raw = np.asarray(raw)
    if raw[0] != 0 or raw[-1] != n_tokens or int(raw.max()) > n_tokens:
        raise EulerError(
            f"{path}: offsets must run from 0 to the {n_tokens} tokens, found "
            f"{int(raw[0])} .. {int(raw[-1])} (max {int(raw.max())})"
        )
    offsets = raw.astype(np.int64)
    steps = np.diff(offsets)
    bad = np.flatnonzero((steps <= 0) | (steps > context + 1))
    if bad.size:
        i = int(bad[0])
        raise EulerError(
            f"{path}: position {i + 1}: record {i} spans {int(steps[i])} tokens, "
            f"expected 1 to {context + 1} (offsets must rise)"
        )
    return offsets
