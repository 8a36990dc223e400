"""SFT data: Alpaca records -> chat-template token windows with a loss mask.

What a C-token context keeps of each record, and how records share windows, is the
policy of sft_policy.py (default: responses of at most 40 tokens, longer ones cut at a
sentence end and closed by <|end|>, several records packed into each window of C + 1
tokens; docs/sft-policy.md measures the choices).
Prepared folder: manifest.json (kind "sft", the policy and per-split counts),
tokenizer.json, val-instructions.json (the held-out records as given, an Alpaca file
for `euler eval --instructions`) and per split sft-<split>.tokens.bin,
sft-<split>.mask.bin (uint8), sft-<split>.offsets.bin (uint64, windows + 1 entries:
window i is tokens[offsets[i]:offsets[i+1]]) and sft-<split>.records.bin (uint64, the
position of each record's first token; every window starts with one).
Training on it needs a model context of at least C (SFTDataset's `context`).
"""

from __future__ import annotations

import json
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
from euler.data.sft_policy import check_long, classify, pack_windows
from euler.data.shards import first_out_of_range, open_shard, token_dtype, write_shard
from euler.errors import EulerError
from euler.ownership import SFT_DATA
from euler.schema import MISSING, Fields, describe, read_json

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

FIELDS = ("instruction", "input", "output")
HELDOUT_FILE = "val-instructions.json"
LONG_HELP = {
    "cut": "cut the response at its last sentence end that fits, closed by the end token",
    "truncate": "cut to the window's C + 1 tokens, with no end token",
    "drop": "drop the record",
}


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
    long: str = "cut",
    pack: bool = True,
    max_answer: int = 40,
) -> dict:
    """Render Alpaca files/URLs into SFT windows in `out_dir`; return the manifest.

    long: what a record longer than a window (or whose response exceeds max_answer > 0
    tokens) becomes (sft_policy.LONG_RULES); pack: several whole records to a window. An
    earlier preparation in `out_dir` is replaced only with `overwrite`, and never when it
    holds an instruction file or one of `reads`.
    """
    if not 1 <= context <= MAX_CONTEXT:
        raise EulerError(f"context must be in [1, {MAX_CONTEXT}], got {context}")
    if not items:
        raise EulerError("no instruction files given")
    if not 0.0 <= val_fraction < 1.0:
        raise EulerError(f"val fraction must be in [0, 1), got {val_fraction}")
    check_long(long)
    reads = [*reads, *(Path(i) for i in items if not i.startswith(("http://", "https://")))]
    check_output(Path(out_dir), overwrite, reads, SFT_DATA)  # before any download or encoding
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

    kinds = ("whole", "cut", "truncated", "dropped")
    # dropped_prompt: records whose prompt alone leaves no room for an answer (of dropped)
    stats = {s: dict.fromkeys(("records", *kinds, "dropped_prompt", "kept", "tokens",
                               "loss_tokens"), 0) for s in SPLITS}  # fmt: skip
    kept: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in SPLITS}
    heldout = []
    for rec, p_tok, r_tok in zip(records, prompts, responses, strict=True):
        split = "val" if is_val(render(**rec), seed, val_fraction) else "train"
        if split == "val":
            heldout.append(rec)
        kind, ids, mask = classify(
            prompt_ids(tokenizer, p_tok), response_ids(tokenizer, r_tok), rec["output"].strip(),
            context, long, tokenizer.encode, tokenizer.end_id, max_answer,
        )  # fmt: skip
        st = stats[split]
        st["records"] += 1
        st[kind] += 1
        if kind == "dropped" and len(prompt_ids(tokenizer, p_tok)) > context:
            st["dropped_prompt"] += 1
        if ids is not None:
            st["kept"] += 1
            st["tokens"] += len(ids)
            st["loss_tokens"] += int(mask.sum())
            kept[split].append((ids, mask))

    if not kept["train"]:
        raise EulerError(f"no record fits a context of {context} tokens")
    V = tokenizer.vocab_size
    with staged_dir(Path(out_dir), overwrite, reads, SFT_DATA) as work:
        (work / TOKENIZER_FILE).write_text(tokenizer.to_json(), encoding="utf-8")
        (work / HELDOUT_FILE).write_text(json.dumps(heldout, indent=1), encoding="utf-8")
        for split in SPLITS:
            st = stats[split]
            st["windows"] = _write_windows(work, split, kept[split], context + 1, pack, seed, V)
            st["records_per_window"] = st["kept"] / max(st["windows"], 1)
            st["loss_fraction_of_record_tokens"] = st["loss_tokens"] / max(st["tokens"], 1)
            st["loss_fraction_of_windows"] = st["loss_tokens"] / max(
                st["windows"] * (context + 1), 1
            )
        manifest = {
            "kind": "sft",
            "tokenizer": {
                "file": TOKENIZER_FILE,
                "sha256": tokenizer.sha256,
                "vocab_size": V,
                "eot_id": tokenizer.eot_id,
            },
            "context": context,
            "policy": {"long": long, "pack": pack, "max_answer": max_answer},
            "too_long_rule": LONG_HELP[long],
            "split": {"val_fraction": val_fraction, "seed": seed},
            "inputs": inputs,
            "records": len(records),
            "heldout": {
                "file": HELDOUT_FILE,
                "records": len(heldout),
                "sha256": sha256_file(work / HELDOUT_FILE),
            },
            "splits": stats,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_manifest(work, manifest, [sft_file(s, w) for s in SPLITS for w in SFT_FILES])
    return manifest


def kept_line(m: dict) -> str:
    """One line on an SFT manifest: the share of records kept, why the others were dropped,
    and the flag that keeps more."""
    sts = m["splits"].values()
    records, kept = sum(st["records"] for st in sts), sum(st["kept"] for st in sts)
    prompt = sum(st.get("dropped_prompt", 0) for st in sts)
    answer = sum(st["dropped"] for st in sts) - prompt
    long, max_answer, context = m["policy"]["long"], m["policy"]["max_answer"], m["context"]
    line = f"kept {kept:,} of {records:,} records ({kept / max(records, 1):.0%})"
    why = []
    if answer:
        room = (f"the room left for it (at most {max_answer} tokens: --max-answer)" if max_answer
                else "the room the context leaves")  # fmt: skip
        why.append(
            f"{answer:,} whose response is longer than {room} with no sentence end to cut it "
            f"at (--long {long})" if long == "cut"
            else f"{answer:,} whose response is longer than {room} (--long drop)"
        )  # fmt: skip
    if prompt:
        why.append(f"{prompt:,} whose prompt alone fills the {context}-token context")
    if not why:
        return line + ": every record"
    more = []
    if answer:
        more.append(f"--long truncate keeps {records - prompt:,} (responses cut mid-sentence, "
                    "without an end token)")  # fmt: skip
        if max_answer:
            more.append("a larger --max-answer (0: what the context leaves) keeps more whole")
    if prompt:
        more.append("a larger --seq-len keeps the long prompts")
    return f"{line}; dropped {' and '.join(why)}. {'; '.join(more)}"


def _write_windows(
    work: Path, split: str, kept: list[tuple[np.ndarray, np.ndarray]], W: int, pack: bool,
    seed: int, V: int,
) -> int:  # fmt: skip
    """Pack one split's records into windows of at most W tokens and write its four
    shards; return the number of windows."""
    lengths = np.array([len(ids) for ids, _ in kept], dtype=np.int64)
    windows = pack_windows(lengths, W, pack, seed)
    order = [i for w in windows for i in w]
    sizes = np.array([sum(lengths[i] for i in w) for w in windows], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lengths[order])[:-1]]) if order else np.zeros(0)
    ids = np.concatenate([kept[i][0] for i in order]) if order else np.zeros(0, np.int32)
    mask = np.concatenate([kept[i][1] for i in order]) if order else np.zeros(0, np.uint8)
    write_shard(work / sft_file(split, "tokens"), ids, V, token_dtype(V))
    write_shard(work / sft_file(split, "mask"), mask, V, np.uint8)
    write_shard(work / sft_file(split, "offsets"), offsets, V, np.uint64)
    write_shard(work / sft_file(split, "records"), starts.astype(np.uint64), V, np.uint64)
    return len(windows)


class SFTDataset:
    """The prepared SFT windows of one split; batches of (tokens, mask, segments).

    Row b of a batch is one window (one or several records) placed at position 0 and
    padded with <|endoftext|> to T+K tokens; mask[b, j] = 1 iff token j is a response
    token or a response's closing end token (<|end|>; ChatML: <|im_end|>); segments[b, j]
    is the index inside the row of the record that token j belongs to (-1 on padding).
    The target of head k at position t is tokens[b, t+1+k] and counts iff
    mask[b, t+1+k] = 1 and segments[b, t] = segments[b, t+1+k] (make_targets): no target
    crosses a record boundary.
    """

    def __init__(
        self,
        folder: str | Path,
        split: str = "train",
        vocab_size: int | None = None,
        context: int | None = None,
    ) -> None:
        """Open one split of a prepared SFT folder, checked: the manifest, each shard's
        size and sampled checksum, element sizes, token ids below V, window offsets rising
        from 0 to the number of tokens, record starts rising and holding every window's
        start, and a mask of 0/1 as long as the tokens.

        context: the model's context T; data prepared for a longer one is refused (its
        windows would be cut at T + K without a word), here or else at the first batch.
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
        sizes = {"tokens": token_dtype(V)().itemsize, "mask": 1, "offsets": 8, "records": 8}
        for what in SFT_FILES:
            path = folder / sft_file(split, what)
            arrays[what] = open_shard(path, V, sizes[what])  # a foreign file is named first
            check_sample(path, m["files"][path.name])
        self.tokens, self.mask = arrays["tokens"], arrays["mask"]
        self.offsets = _checked_offsets(folder / sft_file(split, "offsets"), arrays["offsets"],
                                        len(self.tokens), m["context"])  # fmt: skip
        self.starts = _checked_starts(folder / sft_file(split, "records"), arrays["records"],
                                      self.offsets)  # fmt: skip
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
                f"--seq-len {T}"
            )

    def __len__(self) -> int:
        """The number of windows."""
        return len(self.offsets) - 1

    def _rows(self, index: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(len(index), W) int32 tokens, uint8 mask and int32 segments; index -1 pads a row."""
        tokens = np.full((len(index), W), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(index), W), dtype=np.uint8)
        segments = np.full((len(index), W), -1, dtype=np.int32)
        for b, i in enumerate(index):
            if i < 0:
                continue
            lo, hi = self.offsets[i], min(self.offsets[i + 1], self.offsets[i] + W)
            tokens[b, : hi - lo] = self.tokens[lo:hi]
            mask[b, : hi - lo] = self.mask[lo:hi]
            first = np.zeros(hi - lo, dtype=np.int32)
            s0, s1 = np.searchsorted(self.starts, [lo, hi])
            first[self.starts[s0:s1] - lo] = 1
            segments[b, : hi - lo] = np.cumsum(first) - 1
        return tokens, mask, segments

    def batch(
        self, step: int, seed: int, B: int, T: int, K: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, T+K) tokens, mask and segments (see the class), windows drawn from (seed, step)."""
        self.check_context(T)
        if len(self) == 0:
            raise EulerError("this SFT split holds no records")
        rng = np.random.default_rng([seed, step])
        return self._rows(rng.integers(0, len(self), size=B), T + K)

    def iter_sequential(
        self, B: int, T: int, K: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every window once, in order, B per batch; the last batch is filled with padding rows."""
        self.check_context(T)
        for start in range(0, len(self), B):
            index = np.arange(start, start + B)
            index[index >= len(self)] = -1
            yield self._rows(index, T + K)


def _checked_offsets(path: Path, raw: np.ndarray, n_tokens: int, context: int) -> np.ndarray:
    """The int64 window offsets, checked: 0 first, rising, n_tokens last, and no window
    longer than the C + 1 tokens that prepare writes."""
    if len(raw) == 0:
        raise EulerError(f"{path}: no offsets (a split of R windows has R + 1)")
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
            f"{path}: position {i + 1}: window {i} spans {int(steps[i])} tokens, "
            f"expected 1 to {context + 1} (offsets must rise)"
        )
    return offsets


def _checked_starts(path: Path, raw: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The int64 record starts, checked: rising, below the number of tokens, and holding
    every window's first position (a window begins with a record)."""
    starts = np.asarray(raw).astype(np.int64)
    n_tokens = int(offsets[-1])
    if len(starts) and (int(starts.min()) < 0 or int(np.asarray(raw).max()) >= max(n_tokens, 1)):
        raise EulerError(f"{path}: record starts must lie in 0 .. {n_tokens - 1}")
    bad = np.flatnonzero(np.diff(starts) <= 0)
    if bad.size:
        raise EulerError(f"{path}: position {int(bad[0]) + 1}: record starts must rise")
    missing = np.flatnonzero(~np.isin(offsets[:-1], starts))
    if missing.size:
        i = int(missing[0])
        raise EulerError(f"{path}: window {i} (at token {int(offsets[i])}) starts no record")
    return starts
