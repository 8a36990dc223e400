"""Tied input and output embeddings (ModelConfig.tie_embeddings): head 0 reads tok_emb.

The engine's logits against the NumPy reference, tok_emb's gradient against finite
differences (scatter plus head 0's product), bf16 emulation against fp32, the KV-cache
decoder against the training forward, and the checkpoint's record of the option. The
PyTorch oracle (test_oracle_torch.py, test_torch_peer.py) and `euler gradcheck` carry tied
cases too; the GPU's run in the simulator (test_gpu_sim.py).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from numpy_reference import reference_forward

from euler.cpu.backend import CpuBackend
from euler.errors import EulerError
from euler.inference.batch import BatchDecoder
from euler.model.config import PRESETS, ModelConfig
from euler.model.params import ParamLayout, head_weights, param_table
from euler.model.transformer import Model, make_targets
from euler.training import checkpoint

TIED = dataclasses.replace(PRESETS["tiny"], tie_embeddings=True)


def _flat(cfg: ModelConfig, seed: int = 0, dtype=np.float64) -> np.ndarray:
    layout = ParamLayout(cfg)
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal(layout.size) * 0.2
    flat[layout.n_decay :] = 1.0 + rng.uniform(-0.3, 0.3, layout.size - layout.n_decay)
    return flat.astype(dtype)


def test_table_holds_one_matrix_fewer() -> None:
    untied = PRESETS["tiny"]
    names = [n for n, _, _ in param_table(TIED)]
    shapes = dict((n, s) for n, s, _ in param_table(TIED))
    assert shapes["mtp_heads"] == (untied.n_mtp - 1, untied.vocab_size, untied.d_model)
    assert untied.n_params() - TIED.n_params() == untied.vocab_size * untied.d_model
    one = dataclasses.replace(TIED, n_mtp=1)
    assert "mtp_heads" not in [n for n, _, _ in param_table(one)]
    assert "tok_emb" in names
    views = ParamLayout(TIED).views(np.arange(ParamLayout(TIED).size, dtype=np.float64))
    heads = head_weights(TIED, views)
    assert len(heads) == TIED.n_mtp
    assert np.shares_memory(heads[0], views["tok_emb"])


@pytest.mark.parametrize("k", [4, 1])
def test_logits_equal_the_numpy_reference(k: int) -> None:
    cfg = dataclasses.replace(TIED, n_mtp=k)
    flat = _flat(cfg)
    rng = np.random.default_rng(1)
    window = rng.integers(0, cfg.vocab_size, (2, cfg.context + k))
    tokens, targets = window[:, : cfg.context], make_targets(window, cfg.context, k)
    model = Model(cfg, CpuBackend(attention_tile=8), dtype=np.float64, flat_params=flat)
    loss = model.forward(tokens, targets)
    ref_loss, ref_logits = reference_forward(cfg, ParamLayout(cfg).views(flat), tokens, targets)
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
    for h in range(k):
        np.testing.assert_allclose(model.head_logits(h), ref_logits[h], rtol=1e-11, atol=1e-11)


def test_embedding_gradient_adds_head_zero() -> None:
    """tok_emb's gradient against central differences of the loss, on rows that are both
    looked up and predicted (both terms present) and on rows only predicted (head 0 only)."""
    cfg = TIED
    flat = _flat(cfg, seed=2)
    rng = np.random.default_rng(3)
    window = rng.integers(0, cfg.vocab_size // 2, (2, cfg.context + cfg.n_mtp))
    tokens, targets = window[:, : cfg.context], make_targets(window, cfg.context, cfg.n_mtp)
    model = Model(cfg, CpuBackend(attention_tile=8), dtype=np.float64, flat_params=flat)
    for accumulate in (False, True):  # a second micro-batch adds the same again
        model.forward(tokens, targets, need_grad=True, accumulate=accumulate)
        model.backward()
    grads = model.g["tok_emb"] / 2
    off, (V, D) = model.layout.offsets["tok_emb"]
    seen, unseen = int(tokens[0, 0]), cfg.vocab_size - 1  # ids >= V/2 never appear
    h = 1e-5
    for row in (seen, unseen):
        for col in (0, D // 2):
            i = off + row * D + col
            old = model.params[i]
            model.params[i] = old + h
            up = model.forward(tokens, targets)
            model.params[i] = old - h
            down = model.forward(tokens, targets)
            model.params[i] = old
            numeric = (up - down) / (2 * h)
            assert abs(grads[row, col] - numeric) <= 1e-7 + 1e-6 * abs(numeric), (row, col)
    assert np.abs(grads[unseen]).max() > 0  # the head's share reaches unseen rows


def test_bf16_emulation_follows_fp32() -> None:
    """The bf16 model (bf16 copy of tok_emb as head 0) against fp32: loss to bf16's 1%, and
    tok_emb's gradient in the same direction (cosine above 0.99)."""
    cfg = TIED
    flat = _flat(cfg, seed=4, dtype=np.float32)
    rng = np.random.default_rng(5)
    window = rng.integers(0, cfg.vocab_size, (2, cfg.context + cfg.n_mtp))
    tokens, targets = window[:, : cfg.context], make_targets(window, cfg.context, cfg.n_mtp)
    out = {}
    for precision in ("fp32", "bf16"):
        model = Model(cfg, flat_params=flat.copy(), precision=precision)
        loss = model.forward(tokens, targets, need_grad=True)
        model.backward()
        out[precision] = (loss, model.g["tok_emb"].copy())
    (l32, g32), (l16, g16) = out["fp32"], out["bf16"]
    assert abs(l16 - l32) <= 1e-2 * abs(l32)
    cosine = float((g16 * g32).sum() / np.linalg.norm(g16) / np.linalg.norm(g32))
    assert cosine > 0.99, cosine


def test_kv_cache_decoder_equals_the_forward() -> None:
    cfg = TIED
    flat = _flat(cfg, seed=6, dtype=np.float32)
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, (1, 10))
    model = Model(cfg, flat_params=flat)
    model.forward(tokens)
    want = model.head_logits(0)[0]
    dec = BatchDecoder(cfg, flat, 1)
    (xf,) = dec.feed([(0, tokens[0].tolist())])
    np.testing.assert_allclose(dec.logits(xf, 0), want, rtol=1e-5, atol=1e-5)


def test_checkpoint_records_the_option(tmp_path) -> None:
    flat = _flat(TIED, dtype=np.float32)
    path = tmp_path / "tied.safetensors"
    checkpoint.save(path, TIED, flat, None, {}, {}, "")
    ck = checkpoint.load(path)
    assert ck.cfg.tie_embeddings and ck.cfg == TIED
    assert ck.params.tobytes() == flat.tobytes()
    # an untied config refuses the tied checkpoint, naming the field
    with pytest.raises(EulerError, match="tie_embeddings"):
        checkpoint.check_compatible(ck, PRESETS["tiny"])


def test_config_saved_before_the_field_reads_untied() -> None:
    d = json.loads(PRESETS["tiny"].to_json())
    del d["tie_embeddings"]
    assert ModelConfig.from_dict(d) == PRESETS["tiny"]
    with pytest.raises(EulerError, match="tie_embeddings"):
        ModelConfig.from_dict({**d, "tie_embeddings": "yes"})
