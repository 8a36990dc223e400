"""TokenLoader: batches of windows from memory-mapped token shards.

A batch is (B, T+K) int32: row b is T+K consecutive tokens; the model reads
inputs tokens[:, :T] and head k's targets tokens[:, 1+k : 1+k+T].

Random batches depend only on (seed, step): the generator is seeded with the pair,
so a run resumed at step s sees exactly the batches the uninterrupted run saw.
Each row first picks a source with probability proportional to its weight (from
the manifest; tokens when no weight was given), then a shard of that source in
proportion to its tokens, then a uniformly random start inside the shard.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from euler.data.manifest import read_manifest
from euler.data.shards import open_shard, read_header
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
                groups.append((src.get("weight"), files))
        else:
            files = [source] if isinstance(source, (str, Path)) else list(source)
            groups.append((None, [Path(f) for f in files]))

        vocabs = {read_header(f)["vocab_size"] for _, files in groups for f in files}
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
        return out

    def iter_sequential(self, B: int, T: int, K: int) -> Iterator[np.ndarray]:
        """(B, T+K) int32 batches that walk every shard once in order.

        Windows start every T tokens inside a shard, so each token after a shard's
        first is a head-0 target exactly once; the last rows that do not fill a
        batch of B are dropped.
        """
        W = T + K
        rows: list[np.ndarray] = []
        for arr, _ in self.segments:
            for start in range(0, len(arr) - W + 1, T):
                rows.append(np.asarray(arr[start : start + W], dtype=np.int32))
                if len(rows) == B:
                    yield np.stack(rows)
                    rows = []
