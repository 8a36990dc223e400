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

from euler.bench.kernels import layer_cases
from euler.cpu.backend import CpuBackend
from euler.model.config import get_preset
from euler.model.transformer import Model, make_targets
from euler.training.optim import AdamW

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


LAYERS = layer_cases(CpuBackend(), CFG, B, T)  # shared with `euler bench`


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer(benchmark, name):
    """One layer kernel at `small` shapes (batch 16 x 128)."""
    fn = LAYERS[name]
    fn()
    benchmark.pedantic(fn, rounds=20, iterations=1, warmup_rounds=2)
