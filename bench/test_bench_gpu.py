"""GPU engine benchmarks (marked `gpu`, skipped without a CUDA GPU): the `gpu` preset's
training step and each layer kernel's forward/backward, as test_bench_cpu.py does on the CPU.

    pytest bench/test_bench_gpu.py --benchmark-autosave     # save a baseline
    pytest bench/test_bench_gpu.py --benchmark-compare      # compare against it

Shapes: the `gpu` preset at batch 8 x 512 (4096 tokens per step), TF32 matmuls as training
runs. The step's round ends with a stream synchronisation (device time plus one launch
latency); a layer's round is GPU_CALLS calls back to back and one synchronisation, so that
the launches queue ahead of the device (extra_info's ms_per_call is the fastest round's
share of one call).
"""

from __future__ import annotations

import numpy as np
import pytest

from euler.bench.kernels import GPU_CALLS, layer_cases
from euler.model.config import get_preset
from euler.model.transformer import Model, make_targets
from euler.training.optim import AdamW

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning"),
]

CFG = get_preset("gpu")
B, T = 8, 512
N = B * T


@pytest.fixture(scope="module")
def be():
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no CUDA GPU")
    from euler.gpu.backend import GpuBackend

    return GpuBackend(tf32=True)


def test_train_step_gpu(benchmark, be):
    """forward + backward + AdamW of `gpu`, batch 8 x 512."""
    model = Model(CFG, backend=be, dtype=np.float32, seed=0)
    opt = AdamW(model)
    window = np.random.default_rng(0).integers(0, CFG.vocab_size, (B, T + CFG.n_mtp))
    tokens, targets = window[:, :T], make_targets(window, T, CFG.n_mtp)

    def step():
        model.forward(tokens, targets, need_grad=True)
        model.backward()
        opt.step(3e-4)
        be.synchronize()

    step()
    benchmark.pedantic(step, rounds=10, iterations=1, warmup_rounds=1)
    benchmark.extra_info["tokens_per_s"] = N / benchmark.stats.stats.min
    benchmark.extra_info["gflop_per_s"] = N * 6 * CFG.n_params() / benchmark.stats.stats.min / 1e9


# the names only: the cases themselves need a GPU, so they are built inside the test
LAYER_NAMES = [
    "embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward",
    "rope_forward", "rope_backward", "attention_forward", "attention_backward",
    "swiglu_forward", "swiglu_backward", "residual_forward", "cross_entropy_forward_backward",
    "matmul_qkv_forward", "matmul_qkv_backward", "adamw_step",
]  # fmt: skip


@pytest.fixture(scope="module")
def layers(be):
    cases = layer_cases(be, CFG, B, T)
    assert sorted(cases) == sorted(LAYER_NAMES), "layer_cases changed: update LAYER_NAMES"
    return cases


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_layer_gpu(benchmark, be, layers, name):
    """One layer kernel at `gpu` shapes (batch 8 x 512), GPU_CALLS calls a round."""
    fn = layers[name]

    def calls():
        for _ in range(GPU_CALLS):
            fn()
        be.synchronize()

    calls()
    benchmark.pedantic(calls, rounds=20, iterations=1, warmup_rounds=2)
    benchmark.extra_info["calls_per_round"] = GPU_CALLS
    benchmark.extra_info["ms_per_call"] = 1e3 * benchmark.stats.stats.min / GPU_CALLS
