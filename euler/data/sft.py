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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from euler.data.chat_template import prompt_ids, prompt_text, render, response_ids
from euler.data.download import download
from euler.data.files import sha256_file, staged_dir
from euler.data.manifest import read_manifest, write_manifest
from euler.data.prepare import SPLITS, TOKENIZER_FILE, is_val
from euler.data.shards import open_shard, token_dtype, write_shard
from euler.errors import EulerError

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

FIELDS = ("instruction", "input", "output")
TOO_LONG_RULE = "drop if the prompt alone exceeds the context (P > C), else cut to C + 1 tokens"


def load_alpaca(path: Path) -> list[dict]:
    """Records of an Alpaca JSON file (a list of {instruction, input, output}), checked.

    Raises EulerError naming the file and line of invalid JSON, or the record
    index of a record that lacks a field or holds a non-string.
    """
    path = Path(path)
    if not path.is_file():
        raise EulerError(f"instruction file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise EulerError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise EulerError(f"{path}: not UTF-8 (byte {e.start})") from None
    if not isinstance(data, list):
        raise EulerError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    records = []
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise EulerError(f"{path}: record {i} is not an object")
        rec = {"input": "", **rec}
        for key in FIELDS:
            if not isinstance(rec.get(key), str):
                raise EulerError(f"{path}: record {i} has no string field {key!r}")
        records.append({k: rec[k] for k in FIELDS})
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
) -> dict:
    """Render Alpaca files/URLs into SFT shards in `out_dir`; return the manifest."""
    if context < 1:
        raise EulerError(f"context must be positive, got {context}")
    if not items:
        raise EulerError("no instruction files given")
    if not 0.0 <= val_fraction < 1.0:
        raise EulerError(f"val fraction must be in [0, 1), got {val_fraction}")
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
    with staged_dir(Path(out_dir)) as work:
        tokenizer.save(str(work / TOKENIZER_FILE))
        for split in SPLITS:
            pairs = seqs[split]
            lengths = np.array([len(ids) for ids, _ in pairs], dtype=np.uint64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
            ids = np.concatenate([i for i, _ in pairs]) if pairs else np.zeros(0, np.int32)
            mask = np.concatenate([m for _, m in pairs]) if pairs else np.zeros(0, np.uint8)
            write_shard(work / f"sft-{split}.tokens.bin", ids, V, token_dtype(V))
            write_shard(work / f"sft-{split}.mask.bin", mask, V, np.uint8)
            write_shard(work / f"sft-{split}.offsets.bin", offsets, V, np.uint64)
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
        write_manifest(work, manifest)
    return manifest


class SFTDataset:
    """Rendered SFT records of one split; batches of (tokens, mask) windows.

    Row b of a batch is one record placed at position 0, cut to T+K tokens and padded
    with <|endoftext|>; mask[b, j] = 1 iff token j is a response token or the
    response's closing <|end|>. The target of head k at position t is
    tokens[b, t+1+k] and counts iff mask[b, t+1+k] = 1.
    """

    def __init__(self, folder: str | Path, split: str = "train", vocab_size: int | None = None):
        if split not in SPLITS:
            raise EulerError(f"split must be 'train' or 'val', got {split!r}")
        folder = Path(folder)
        self.manifest = read_manifest(folder, kind="sft")
        V = vocab_size if vocab_size is not None else self.manifest["tokenizer"]["vocab_size"]
        self.tokens = open_shard(folder / f"sft-{split}.tokens.bin", V)
        self.mask = open_shard(folder / f"sft-{split}.mask.bin", V)
        self.offsets = np.asarray(open_shard(folder / f"sft-{split}.offsets.bin", V), np.int64)
        if len(self.mask) != len(self.tokens) or self.offsets[-1] != len(self.tokens):
            raise EulerError(f"{folder}: {split} tokens, mask and offsets disagree in length")
        self.pad_id = int(self.manifest["tokenizer"]["eot_id"])

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
        if len(self) == 0:
            raise EulerError("this SFT split holds no records")
        rng = np.random.default_rng([seed, step])
        return self._rows(rng.integers(0, len(self), size=B), T + K)

    def iter_sequential(self, B: int, T: int, K: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every record once, in order, B per batch; the last batch is filled with padding rows."""
        for start in range(0, len(self), B):
            index = np.arange(start, start + B)
            index[index >= len(self)] = -1
            yield self._rows(index, T + K)
