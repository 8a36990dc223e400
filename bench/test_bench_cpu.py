"""CPU engine benchmarks: one full training step of `small` and each layer's forward/backward.

    pytest bench/test_bench_cpu.py --benchmark-only            # run
    pytest bench/test_bench_cpu.py --benchmark-autosave        # save a baseline
    pytest bench/test_bench_cpu.py --benchmark-compare         # compare against it

Shapes: the `small` preset at batch 16 x 128 tokens (2048 tokens per step). Each result
carries tokens/s and GFLOP/s in extra_info; the step counts 6.3 MFLOP per token (6 x the
parameters), the usual convention, so attention's own FLOPs are not credited.
"""

from __future__ import annotations

import numpy as np
import pytest

from euler.config import get_preset
from euler.cpu.backend import CpuBackend
from euler.model import Model, make_targets, rope_tables
from euler.optim import AdamW

CFG = get_preset("small")
B, T = 16, 128
N = B * T
FLOP_PER_TOKEN = 6 * CFG.n_params()


@pytest.fixture(scope="module")
def model_and_batch():
    model = Model(CFG, dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)
    window = rng.integers(0, CFG.vocab_size, (B, T + CFG.n_mtp))
    return model, window[:, :T], make_targets(window, T, CFG.n_mtp)


def test_train_step_small(benchmark, model_and_batch):
    """forward + backward + AdamW of `small`, batch 16 x 128."""
    model, tokens, targets = model_and_batch
    opt = AdamW(model)

    def step():
        model.forward(tokens, targets, need_grad=True)
        model.backward()
        opt.step(1e-3)

    step()
    benchmark.pedantic(step, rounds=10, iterations=1, warmup_rounds=1)
    sec = benchmark.stats.stats.min
    benchmark.extra_info["tokens_per_s"] = N / sec
    benchmark.extra_info["gflop_per_s"] = N * FLOP_PER_TOKEN / sec / 1e9


def test_forward_small(benchmark, model_and_batch):
    """Forward with loss only (evaluation), batch 16 x 128."""
    model, tokens, targets = model_and_batch
    benchmark.pedantic(lambda: model.forward(tokens, targets), rounds=10, warmup_rounds=1)
    benchmark.extra_info["tokens_per_s"] = N / benchmark.stats.stats.min


def _layer_cases():
    """(name, callable) for each layer's forward and backward at `small` shapes."""
    be = CpuBackend()
    rng = np.random.default_rng(0)
    f = np.float32
    D, F, V, H, G, E = CFG.d_model, CFG.ffn_hidden, CFG.vocab_size, CFG.n_head, CFG.n_kv_head, 32
    r = lambda *s: rng.standard_normal(s).astype(f)  # noqa: E731
    x, w, y, rstd = r(N, D), r(D), r(N, D), r(N)
    dx, dw = r(N, D), r(D)
    qkv, att, lse, dqkv = r(B, T, CFG.qkv_dim), r(B, T, H * E), r(B, H, T), r(B, T, CFG.qkv_dim)
    gu, h, dgu = r(N, 2 * F), r(N, F), r(N, 2 * F)
    logits, losses = r(N, V), r(N)
    targets = rng.integers(0, V, N).astype(np.int32)
    tokens = rng.integers(0, V, N).astype(np.int32)
    wte, dwte, wqkv = r(V, D), r(V, D), r(CFG.qkv_dim, D)
    cos, sin = rope_tables(CFG, f)
    be.rmsnorm_forward(y, rstd, x, w, 1e-5)
    be.attention_forward(att, lse, qkv, H, G, E)
    return {
        "embedding_forward": lambda: be.embedding_forward(x, tokens, wte),
        "embedding_backward": lambda: be.embedding_backward(dwte, dx, tokens, False),
        "rmsnorm_forward": lambda: be.rmsnorm_forward(y, rstd, x, w, 1e-5),
        "rmsnorm_backward": lambda: be.rmsnorm_backward(dx, dw, y, dx, x, w, rstd, False),
        "rope_forward": lambda: be.rope_forward(qkv, cos, sin, H, G, E),
        "rope_backward": lambda: be.rope_backward(dqkv, cos, sin, H, G, E),
        "attention_forward": lambda: be.attention_forward(att, lse, qkv, H, G, E),
        "attention_backward": lambda: be.attention_backward(dqkv, att, qkv, att, lse, H, G, E),
        "swiglu_forward": lambda: be.swiglu_forward(h, gu),
        "swiglu_backward": lambda: be.swiglu_backward(dgu, h, gu),
        "residual_forward": lambda: be.residual_forward(y, x, dx),
        "cross_entropy_forward_backward": lambda: be.cross_entropy_forward_backward(
            losses, logits, targets, 1.0 / N
        ),
        "matmul_qkv_forward": lambda: be.matmul(qkv.reshape(N, -1), x, wqkv, trans_b=True),
    }


LAYERS = _layer_cases()


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer(benchmark, name):
    """One layer kernel at `small` shapes (batch 16 x 128)."""
    fn = LAYERS[name]
    fn()
    benchmark.pedantic(fn, rounds=20, iterations=1, warmup_rounds=2)
