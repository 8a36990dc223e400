"""The batches of a run: training and validation, drawn from (seed, index) alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.transformer import make_targets
from euler.training.config import TrainConfig

SFT_SAMPLE_INSTRUCTION = "Give three tips for staying healthy."


class Batches:
    """Training and validation batches of one run: (tokens (B, T) int32, targets (K, B, T)).

    The tokenizer comes from the data folder (for the embedded corpus, one of cfg.vocab_size
    tokens is trained); the model's vocabulary is sized to it.
    """

    def __init__(self, tc: TrainConfig, cfg: ModelConfig, log=print):
        from euler.data import SFTDataset, TokenLoader, default_corpus_dir
        from euler.data.manifest import data_identity, folder_tokenizer, read_manifest

        self.tc, self.K = tc, cfg.n_mtp
        self.T = tc.seq_len or cfg.context
        if self.T > cfg.context:
            raise EulerError(f"--seq-len {tc.seq_len} exceeds the model's context ({cfg.context})")
        cfg.check_sequence(self.T)
        if tc.kind == "pretrain":
            folder = Path(tc.data) if tc.data else default_corpus_dir(cfg.vocab_size, log=log)
        else:
            folder = Path(tc.data)
        if not folder.is_dir():
            raise EulerError(f"data folder not found: {folder}")
        manifest = read_manifest(folder, kind=tc.kind)
        if tc.kind == "sft" and manifest["context"] < self.T:
            # SFT windows hold C + 1 tokens: a longer T (an imported model's context of
            # 2,048 against data prepared for 256) would only compute padding
            self.T = int(manifest["context"])
            cfg.check_sequence(self.T)
        self.tokenizer = folder_tokenizer(folder, manifest)  # checked against the manifest
        self.folder = folder
        self.identity = data_identity(folder, manifest)  # what a resume checks
        V = self.tokenizer.vocab_size
        if tc.kind == "pretrain":
            self.train = TokenLoader(folder, "train", vocab_size=V)
            self.val = TokenLoader(folder, "val", vocab_size=V)
        else:
            self.train = SFTDataset(folder, "train", vocab_size=V, context=self.T)
            self.val = SFTDataset(folder, "val", vocab_size=V, context=self.T)
            if len(self.val) == 0:
                raise EulerError(f"{folder}: no held-out records (prepare with --val-fraction > 0)")

    def get(self, split: str, index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch `index` of a split, drawn from (seed, index) alone."""
        src = self.train if split == "train" else self.val
        B, T, K = self.tc.batch_size, self.T, self.K
        if self.tc.kind == "pretrain":
            window = src.batch(index, seed, B, T, K)
            return window[:, :T], make_targets(window, T, K)
        # SFT: the loss counts response tokens only, each within its own record
        window, mask, segments = src.batch(index, seed, B, T, K)
        return window[:, :T], make_targets(window, T, K, mask, segments)

    def sample_prompt(self) -> np.ndarray:
        """The prompt of the text sample shown at each evaluation."""
        from euler.data import encode_prompt

        if self.tc.kind == "sft":
            return encode_prompt(self.tokenizer, SFT_SAMPLE_INSTRUCTION)
        return np.concatenate([[self.tokenizer.eot_id], self.tokenizer.encode("The")])
