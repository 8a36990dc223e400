"""The GPU's bf16 engine against the CPU's emulation of it, on a real GPU (marked `gpu`).

The layer checks are bf16_checks.py's (the CUDA simulator runs them too, on tiny shapes:
test_gpu_sim.py); here they run at GPU_SIZES, and whole bf16 training steps of the `small`
preset must follow the CPU emulation's losses.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from bf16_checks import BF16_CHECKS
from test_gpu_device import GPU_SIZES, _gpu_backend, markov_batches

from euler.cpu.backend import CpuBackend
from euler.model.config import PRESETS
from euler.model.transformer import Model
from euler.training.optim import AdamW

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning"),
]


@pytest.mark.parametrize("check", BF16_CHECKS, ids=lambda f: f.__name__[6:])
def test_layer_bf16(check) -> None:
    check(CpuBackend(), _gpu_backend(), np.random.default_rng(0), GPU_SIZES)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_bf16_training_steps_follow_the_cpu_emulation(tied: bool) -> None:
    """20 AdamW steps of the `small` preset (untied, then tied) in bf16 on both backends
    from the same weights and batches: the losses agree to 1% at every step (bf16 rounds at
    2^-8 relative; the two differ in float32 summation orders before each rounding, and in
    attention's P and dS, which the GPU rounds to bf16 inside the kernel)."""
    cfg = dataclasses.replace(PRESETS["small"], tie_embeddings=tied)
    B, T, steps = 4, 128, 20
    losses = {}
    for name, be in (("cpu", CpuBackend()), ("gpu", _gpu_backend())):
        model = Model(cfg, backend=be, seed=0, precision="bf16")
        opt = AdamW(model)
        losses[name] = []
        for tokens, targets in markov_batches(cfg.vocab_size, B, T, cfg.n_mtp, steps):
            loss = model.forward(tokens, targets, need_grad=True)
            model.backward()
            opt.step(1e-3)
            losses[name].append(float(loss))
    cpu, gpu = np.array(losses["cpu"]), np.array(losses["gpu"])
    assert np.all(np.isfinite(gpu)), gpu
    np.testing.assert_allclose(gpu, cpu, rtol=1e-2)
    assert cpu[-1] < cpu[0] - 0.1  # the steps train
