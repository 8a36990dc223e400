"""TokenLoader: batches of windows from memory-mapped token shards.

A batch is (B, T+K) int32: row b is T+K consecutive tokens; the model reads
inputs tokens[:, :T] and head k's targets tokens[:, 1+k : 1+k+T].

Random batches depend only on (seed, step): the generator is seeded with the pair,
so a run resumed at step s sees exactly the batches the uninterrupted run saw.
Each row first picks a source with probability proportional to its weight (from
the manifest; tokens when no weight was given), then a shard of that source in
proportion to its tokens, then a uniformly random start inside the shard.

Opening a folder checks its manifest and each shard's size and sampled checksum
(checksums.py); every window is checked for ids outside the vocabulary before use.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from euler.data.checksums import check_sample
from euler.data.manifest import read_manifest
from euler.data.shards import open_shard, read_header, token_dtype
from euler.errors import EulerError


class TokenLoader:
    """Windows of T+K tokens from the shards of one split.

    `source` is a folder prepared by `euler data prepare` (its manifest names the
    shards of each split and the source weights) or one shard file / a list of them
    (then `split` is not consulted and all files form one source).
    """

    def __init__(
        self,
        source: str | Path | Sequence[str | Path],
        split: str = "train",
        vocab_size: int | None = None,
    ) -> None:
        if split not in ("train", "val"):
            raise EulerError(f"split must be 'train' or 'val', got {split!r}")
        self.split = split
        self.manifest: dict | None = None
        self.tokenizer_path: Path | None = None  # the folder's tokenizer.json, if a folder
        groups: list[tuple[float | None, list[Path]]] = []  # (weight, shard files) per source
        if isinstance(source, (str, Path)) and Path(source).is_dir():
            folder = Path(source)
            self.manifest = read_manifest(folder, kind="pretrain")
            self.tokenizer_path = folder / self.manifest["tokenizer"]["file"]
            for src in self.manifest["sources"]:
                files = [folder / name for name in src["shards"][split]]
                groups.append((src["weight"], files))
            for _, files in groups:
                for f in files:
                    read_header(f)  # a foreign file is named as such before its checksum
                    check_sample(f, self.manifest["files"][f.name])
        else:
            files = [source] if isinstance(source, (str, Path)) else list(source)
            groups.append((None, [Path(f) for f in files]))

        heads = {f: read_header(f) for _, files in groups for f in files}
        for f, h in heads.items():  # a mask or offsets shard is not a token shard
            want = np.dtype(token_dtype(h["vocab_size"])).itemsize
            if h["dtype"].itemsize != want:
                raise EulerError(
                    f"{f}: header: element size {h['dtype'].itemsize}, expected {want} "
                    f"(token ids of a {h['vocab_size']}-token vocabulary)"
                )
        vocabs = {h["vocab_size"] for h in heads.values()}
        if len(vocabs) > 1:
            raise EulerError(f"shards disagree on the vocabulary size: {sorted(vocabs)}")
        self.vocab_size = vocabs.pop() if vocabs else vocab_size
        if vocab_size is not None and self.vocab_size != vocab_size:
            raise EulerError(
                f"{source}: shards were written for a vocabulary of {self.vocab_size} "
                f"tokens, but the tokenizer has {vocab_size}"
            )
        # segments: (memmap, source index); weights: one per source (None = by tokens)
        self.segments = [(open_shard(f), i) for i, (_, files) in enumerate(groups) for f in files]
        self.paths = [f for _, files in groups for f in files]  # the file of each segment
        self.weights = [w for w, _ in groups]
        self._probs: dict[int, np.ndarray] = {}

    @property
    def n_tokens(self) -> int:
        """Tokens in this split, over all shards."""
        return sum(len(a) for a, _ in self.segments)

    def check_tokenizer(self, sha256: str) -> None:
        """Raise EulerError unless the manifest's tokenizer hash is `sha256`."""
        if self.manifest is None:
            return
        want = self.manifest["tokenizer"]["sha256"]
        if want != sha256:
            raise EulerError(
                f"the data was tokenized by tokenizer {want[:12]}, not by the given {sha256[:12]}"
            )

    def _segment_probs(self, W: int) -> np.ndarray:
        """Probability of drawing each segment for windows of W tokens (cached per W)."""
        if W in self._probs:
            return self._probs[W]
        sizes = np.array([max(len(a) - W + 1, 0) for a, _ in self.segments], dtype=np.float64)
        src = np.array([s for _, s in self.segments], dtype=np.int64)
        src_sizes = np.bincount(src, weights=sizes, minlength=len(self.weights))
        if all(w is not None for w in self.weights):
            src_w = np.array(self.weights, dtype=np.float64)
        else:
            src_w = src_sizes.copy()
        src_w[src_sizes == 0] = 0.0  # a source with no window of W tokens cannot be drawn
        if src_w.sum() <= 0:
            raise EulerError(
                f"split {self.split!r} has no shard with at least T+K = {W} tokens "
                f"({self.n_tokens} tokens in all)"
            )
        src_w /= src_w.sum()
        probs = np.zeros(len(self.segments))
        nonempty = sizes > 0
        probs[nonempty] = src_w[src[nonempty]] * sizes[nonempty] / src_sizes[src[nonempty]]
        probs /= probs.sum()
        self._probs[W] = probs
        return probs

    def batch(self, step: int, seed: int, B: int, T: int, K: int) -> np.ndarray:
        """(B, T+K) int32 windows drawn from (seed, step) alone."""
        W = T + K
        probs = self._segment_probs(W)
        rng = np.random.default_rng([seed, step])
        seg = rng.choice(len(self.segments), size=B, p=probs)
        out = np.empty((B, W), dtype=np.int32)
        for b in range(B):
            arr = self.segments[seg[b]][0]
            start = int(rng.integers(0, len(arr) - W + 1))
            out[b] = arr[start : start + W]
            self._check_ids(out[b], seg[b], start)
        return out

    def _check_ids(self, row: np.ndarray, seg: int, start: int) -> None:
        """Refuse a window holding an id >= V (a corrupt shard): the model's kernels do
        not bounds-check an embedding lookup."""
        if self.vocab_size is not None and row.max(initial=0) >= self.vocab_size:
            at = start + int(np.argmax(row >= self.vocab_size))
            raise EulerError(
                f"{self.paths[seg]}: position {at}: token id {int(row[at - start])} is outside "
                f"the vocabulary (0..{self.vocab_size - 1}); run `euler data verify`"
            )

    def iter_sequential(self, B: int, T: int, K: int) -> Iterator[np.ndarray]:
        """(B, T+K) int32 batches that walk every shard once in order.

        Windows start every T tokens inside a shard, so each token after a shard's
        first is a head-0 target exactly once; the last rows that do not fill a
        batch of B are dropped.
        """
        W = T + K
        rows: list[np.ndarray] = []
        for seg, (arr, _) in enumerate(self.segments):
            for start in range(0, len(arr) - W + 1, T):
                rows.append(np.asarray(arr[start : start + W], dtype=np.int32))
                self._check_ids(rows[-1], seg, start)
                if len(rows) == B:
                    yield np.stack(rows)
                    rows = []
