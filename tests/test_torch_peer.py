"""The PyTorch peer (euler/bench/torch_peer.py) against the plain-NumPy reference, in float64.

The peer is the gradient oracle for the engine, so its loss and logits must equal the
independent reference to 1e-10, and its autograd gradients must equal central finite
differences of that reference. Skipped where torch is not installed (the `bench` extra).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numpy_reference import make_targets, reference_forward  # noqa: E402

# bench/ is a folder of scripts, not a package
from euler.bench import torch_peer  # noqa: E402
from euler.model.config import PRESETS, ModelConfig  # noqa: E402
from euler.model.params import ParamLayout, init_params, param_table  # noqa: E402

CONFIGS = {
    "tiny": PRESETS["tiny"],
    # head size 6, 3 query heads per kv head, T = 19 not a multiple of any tile
    "odd": ModelConfig(vocab_size=50, d_model=36, n_head=6, n_kv_head=2, n_layer=2, context=19),
    "tied": dataclasses.replace(PRESETS["tiny"], tie_embeddings=True),
}


def _case(
    cfg: ModelConfig, window_len: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """float64 params (norm weights moved off 1), tokens (2, T) and targets (K, 2, T)."""
    layout = ParamLayout(cfg)
    flat = init_params(layout, seed, np.float64)
    rng = np.random.default_rng(seed)
    # an all-ones norm weight would hide a norm that forgets to multiply by it
    flat[layout.n_decay :] += rng.uniform(-0.3, 0.3, layout.size - layout.n_decay)
    T = cfg.context
    window = rng.integers(0, cfg.vocab_size, (2, window_len))
    return layout.views(flat), window[:, :T], make_targets(window, T, cfg.n_mtp)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("extra", [4, 0], ids=["full-window", "short-window"])
def test_peer_forward_equals_reference(name: str, extra: int) -> None:
    """Loss and logits to 1e-10; the short window leaves the last positions without targets."""
    cfg = CONFIGS[name]
    params, tokens, targets = _case(cfg, cfg.context + extra)
    ref_loss, ref_logits = reference_forward(cfg, params, tokens, targets)
    loss, logits = torch_peer.peer_forward(cfg, params, tokens, targets)
    assert logits.shape == ref_logits.shape
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-10)
    assert abs(loss - ref_loss) <= 1e-10, (loss, ref_loss)


def test_peer_loss_skips_heads_without_targets() -> None:
    """T = 2 with no extra tokens: only head 0 has a target, and the loss is its mean."""
    cfg = CONFIGS["tiny"]
    params, _, _ = _case(cfg, cfg.context)
    tokens = np.array([[3, 7], [1, 60]])
    targets = make_targets(tokens, 2, cfg.n_mtp)
    assert (targets[1:] == -1).all()
    ref_loss, _ = reference_forward(cfg, params, tokens, targets)
    loss, grads = torch_peer.loss_and_grads(cfg, params, tokens, targets)
    assert abs(loss - ref_loss) <= 1e-10
    assert all(np.isfinite(g).all() for g in grads.values())
    # heads 1.. predict nothing, so nothing reaches their weights
    assert not grads["mtp_heads"][1:].any() and grads["mtp_heads"][0].any()


@pytest.mark.parametrize("name", CONFIGS)
def test_peer_grads_equal_reference_finite_differences(name: str) -> None:
    """Autograd against central differences of the NumPy reference, 3 entries per tensor."""
    cfg = CONFIGS[name]
    params, tokens, targets = _case(cfg, cfg.context + 2, seed=1)
    loss, grads = torch_peer.loss_and_grads(cfg, params, tokens, targets)
    assert sorted(grads) == sorted(n for n, _, _ in param_table(cfg))
    rng = np.random.default_rng(2)
    h = 1e-5
    worst = (0.0, "")
    for pname, g in grads.items():
        assert g.shape == params[pname].shape, pname
        p = params[pname]
        if pname == "tok_emb":
            # only rows of tokens that occur have a gradient; sample those
            picks = [(int(rng.choice(tokens.ravel())), int(rng.integers(cfg.d_model)))]
        else:
            picks = [tuple(int(rng.integers(s)) for s in p.shape) for _ in range(3)]
        for idx in picks:
            orig = p[idx]
            p[idx] = orig + h
            up, _ = reference_forward(cfg, params, tokens, targets)
            p[idx] = orig - h
            down, _ = reference_forward(cfg, params, tokens, targets)
            p[idx] = orig
            fd = (up - down) / (2 * h)
            err = abs(g[idx] - fd) / max(abs(fd), 1e-3)
            worst = max(worst, (err, f"{pname}{list(idx)}: autograd {g[idx]:.3e} fd {fd:.3e}"))
    # central differences in float64 at h = 1e-5 are good to about 1e-9 here
    assert worst[0] < 1e-6, worst


def test_peer_float32_tracks_float64() -> None:
    cfg = CONFIGS["tiny"]
    params, tokens, targets = _case(cfg, cfg.context + 4)
    loss64, _ = torch_peer.peer_forward(cfg, params, tokens, targets)
    loss32, logits32 = torch_peer.peer_forward(cfg, params, tokens, targets, torch.float32)
    assert logits32.dtype == np.float32
    assert loss32 == pytest.approx(loss64, rel=1e-5)


def test_time_training_reports_throughput() -> None:
    threads = torch.get_num_threads()
    try:
        stats = torch_peer.time_training(
            CONFIGS["tiny"], batch=2, seq=24, steps=2, warmup=1, threads=1
        )
    finally:
        torch.set_num_threads(threads)  # time_training sets it for the whole process
    assert stats["tokens_per_s"] > 0 and stats["ms_per_step_min"] > 0
