"""A run's evaluations: the validation loss over fixed batches, per head, and a text sample.

The training loop (euler/training/loop.py) calls these at every --eval-every steps and
records what they return in metrics.jsonl.
"""

from __future__ import annotations

import numpy as np

from euler.model.config import ModelConfig
from euler.model.transformer import Model
from euler.training.batches import Batches

EVAL_SEED = 1_000_003  # evaluation batches are the same at every evaluation, in every run


def evaluate(model: Model, data: Batches, n_batches: int) -> tuple[float, list[float]]:
    """Validation loss over the fixed evaluation batches: (the training objective, the mean
    over the heads that have targets; per head k, its mean cross-entropy in nats).

    Head 0's loss is the language-model loss proper (next token); head k > 0 predicts the
    token k + 1 places ahead, a harder task, so the mean lies above head 0's.
    """
    K = model.cfg.n_mtp
    losses, head_sum, head_count = [], np.zeros(K), np.zeros(K)
    for i in range(n_batches):
        tokens, targets = data.get("val", i, EVAL_SEED)
        losses.append(float(model.forward(tokens, targets, need_grad=False)))
        per_row = model.be.to_host(model.acts.losses).astype(np.float64)  # (K, B T)
        head_sum += per_row.sum(axis=1)
        head_count += (targets >= 0).reshape(K, -1).sum(axis=1)
    heads = [float(s / c) if c else float("nan") for s, c in zip(head_sum, head_count, strict=True)]
    return float(np.mean(losses)), heads


def text_sample(params: np.ndarray, cfg: ModelConfig, data: Batches, n: int, seed: int) -> str:
    """A short continuation of the sample prompt (temperature 0.8, top-k 40), as text."""
    from euler.inference.generate import Decoder, generate
    from euler.inference.sampling import SamplingConfig

    prompt = data.sample_prompt()
    prompt = prompt[-(cfg.context // 2) :]  # leave room for the sample in a short context
    n = min(n, cfg.context - len(prompt))
    dec = Decoder(cfg, params)
    res = generate(dec, prompt, n, SamplingConfig(0.8, 40, 1.0), np.random.default_rng(seed),
                   stop_ids=(data.tokenizer.end_id, data.tokenizer.eot_id))  # fmt: skip
    return data.tokenizer.decode(prompt[1:] if prompt[0] == data.tokenizer.eot_id else prompt) + (
        data.tokenizer.decode(res.tokens)
    )
