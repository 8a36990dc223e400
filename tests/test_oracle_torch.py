"""Our engine's loss and every gradient against the PyTorch peer's autograd, same weights.

As llm.c's test_gpt2 checks its C gradients against a PyTorch dump: for the `tiny` preset
and an odd-shaped config, in float64 to 1e-10 and in float32 to 1e-5, relative and
norm-wise per tensor (||ours - peer|| / ||peer||). A failure names the worst tensor.
Skipped where torch is not installed (the `bench` extra).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# bench/ is a folder of scripts, not a package
from euler.bench import torch_peer  # noqa: E402
from euler.cpu.backend import CpuBackend  # noqa: E402
from euler.model.config import PRESETS, ModelConfig  # noqa: E402
from euler.model.params import ParamLayout, init_params, param_table  # noqa: E402
from euler.model.transformer import Model, make_targets  # noqa: E402

CONFIGS = {
    "tiny": PRESETS["tiny"],
    # head size 6, 3 query heads per kv head, T = 19: no tile or vector width divides it
    "odd": ModelConfig(
        vocab_size=50, d_model=36, n_head=6, n_kv_head=2, n_layer=2, context=19, n_mtp=4
    ),
    # head 0 is tok_emb: its gradient is the embedding's scatter plus head 0's product
    "tied": dataclasses.replace(PRESETS["tiny"], tie_embeddings=True),
    # one head, tied: no mtp_heads tensor at all
    "tied-k1": dataclasses.replace(PRESETS["tiny"], tie_embeddings=True, n_mtp=1),
}
TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
ATTENTION_TILE = 8  # keys per tile: T = 19 and 24 cross tile boundaries


def _case(cfg: ModelConfig, dtype, seed: int = 0):
    """Flat params (norm weights moved off 1), tokens (3, T), targets (K, 3, T).

    The window is two tokens longer than T, so heads 2 and 3 lack targets at the last
    positions and the -1 (no target) path is exercised too.
    """
    layout = ParamLayout(cfg)
    flat = init_params(layout, seed, np.float64)
    rng = np.random.default_rng(seed)
    # an all-ones norm weight would hide a norm that forgets to multiply by it
    flat[layout.n_decay :] += rng.uniform(-0.3, 0.3, layout.size - layout.n_decay)
    T = cfg.context
    window = rng.integers(0, cfg.vocab_size, (3, T + 2))
    return flat.astype(dtype), window[:, :T], make_targets(window, T, cfg.n_mtp)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", CONFIGS)
def test_loss_and_every_gradient_equal_the_peer(name: str, dtype) -> None:
    cfg = CONFIGS[name]
    flat, tokens, targets = _case(cfg, dtype)
    model = Model(cfg, CpuBackend(attention_tile=ATTENTION_TILE), dtype=dtype, flat_params=flat)
    loss = model.forward(tokens, targets, need_grad=True)
    model.backward()
    ours = model.layout.views(model.grads)

    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    peer_loss, peer = torch_peer.loss_and_grads(
        cfg, ParamLayout(cfg).views(flat), tokens, targets, torch_dtype
    )

    tol = TOLERANCE[dtype]
    assert abs(loss - peer_loss) <= tol * abs(peer_loss), (loss, peer_loss)
    errors = {}
    for pname, _, _ in param_table(cfg):
        assert ours[pname].shape == peer[pname].shape, pname
        diff = np.linalg.norm((ours[pname] - peer[pname]).astype(np.float64))
        errors[pname] = diff / np.linalg.norm(peer[pname].astype(np.float64))
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, (
        f"worst gradient {worst}: relative norm error {errors[worst]:.2e} > {tol:.0e}; "
        f"over tolerance: {sorted(n for n, e in errors.items() if e > tol)}"
    )
