"""The GPU kernels in the CUDA simulator against the CPU engine, on tiny shapes (no GPU needed).

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the one test that
runs in the ordinary session starts this same file again in a subprocess with it set;
there the layer checks of test_gpu_device.py run on a GpuBackend whose blocks and tiles
are small (the simulator runs one Python thread per GPU thread) and whose matrix products
come from NumPy (cuBLAS cannot run in the simulator). Block reductions take their
shared-memory path here, since the simulator has no warp shuffles.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not IN_SIMULATOR:

    def test_kernels_in_simulator() -> None:
        pytest.importorskip("numba.cuda")
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__]
        root = Path(__file__).resolve().parents[1]
        r = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]

else:
    from test_gpu_device import (
        LAYER_CHECKS,
        check_adamw,
        check_attention,
        check_rmsnorm,
        check_rope,
        check_swiglu_residual,
        train_step_matches,
    )

    from euler.cpu.backend import CpuBackend

    SIM_SIZES = SimpleNamespace(B=2, T=11, D=24, F=16, V=40, H=4, G=2, E=8)

    class NumpyBlas:
        """Matrix products for the simulator, on the simulator's host-backed device arrays."""

        def gemm(self, out, a, b, trans_a=False, trans_b=False, accumulate=False):
            host = out.copy_to_host()
            a, b = a.copy_to_host(), b.copy_to_host()
            CpuBackend().matmul(host, a, b, trans_a, trans_b, accumulate)
            out.copy_to_device(host)

    @pytest.fixture(scope="module")
    def gpu():
        from euler.gpu.backend import GpuBackend

        return GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas())

    @pytest.mark.parametrize("check", LAYER_CHECKS, ids=lambda f: f.__name__[6:])
    def test_layer(check, gpu) -> None:
        check(CpuBackend(), gpu, np.random.default_rng(0), SIM_SIZES)

    def test_training_steps(gpu) -> None:
        """Whole steps of a small model through Model and AdamW on the GPU backend: staged
        batches, head weights and learning rate read from device buffers; rows in 16-byte
        pieces (vector.py), as at the presets."""
        from euler.config import ModelConfig

        cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                          context=16, ffn_hidden=24)  # fmt: skip
        train_step_matches(gpu, cfg, B=1, T=8, steps=2, grad_rtol=1e-4)
        # the weight gradients went through the side stream's queue, all joined at the end
        assert gpu._side_count > 0 and gpu._side_pending == []

    def test_training_steps_transposing_weight_gradients(monkeypatch) -> None:
        """As above, every weight gradient's narrower operand transposed first
        (backend.TRANSPOSE_WEIGHT_GRADS, at any width here)."""
        from euler.config import ModelConfig
        from euler.gpu import backend

        monkeypatch.setattr(backend, "TRANSPOSE_WEIGHT_GRADS", True)
        monkeypatch.setattr(backend, "TRANSPOSE_MIN_WIDTH", 0)
        gpu = backend.GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas())
        cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                          context=16, ffn_hidden=24)  # fmt: skip
        train_step_matches(gpu, cfg, B=1, T=8, steps=1, grad_rtol=1e-4)
        assert any(key[0] == "weight_grad_operand" for key in gpu._scratch)

    @pytest.mark.parametrize("M, N", [(24, 10), (10, 24)])  # b narrower, then a
    @pytest.mark.parametrize("accumulate", [False, True])
    def test_weight_gradient_through_a_transposed_operand(M, N, accumulate, monkeypatch):
        from numba import cuda

        from euler.gpu import backend

        monkeypatch.setattr(backend, "TRANSPOSE_WEIGHT_GRADS", True)
        monkeypatch.setattr(backend, "TRANSPOSE_MIN_WIDTH", 0)
        gpu = backend.GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas())
        rng = np.random.default_rng(2)
        a, b, out0 = (rng.standard_normal(s).astype(np.float32) for s in ((37, M), (37, N), (M, N)))
        out = cuda.to_device(out0)
        gpu.matmul_deferred(out, cuda.to_device(a), cuda.to_device(b), True, False, accumulate)
        gpu.wait_deferred()
        want = a.T @ b + (out0 if accumulate else 0)
        np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        assert any(key[0] == "weight_grad_operand" for key in gpu._scratch)

    @pytest.mark.parametrize("shape", [(70, 45), (33, 100), (64, 32)])
    def test_transpose(shape) -> None:
        """Tails in both directions of the 32 x 32 tiles."""
        from numba import cuda

        from euler.gpu.transpose import transpose

        src = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        dst = cuda.to_device(np.zeros(shape[::-1], np.float32))
        transpose(dst, cuda.to_device(src))
        np.testing.assert_array_equal(dst.copy_to_host(), src.T)

    # sizes where no row splits into 16-byte pieces: the kernels' scalar paths (vector.py)
    SCALAR_SIZES = SimpleNamespace(B=1, T=11, D=22, F=18, V=40, H=4, G=2, E=6)

    @pytest.mark.parametrize(
        "check",
        [check_rmsnorm, check_rope, check_swiglu_residual, check_adamw],
        ids=lambda f: f.__name__[6:],
    )
    def test_layer_scalar_paths(check, gpu) -> None:
        check(CpuBackend(), gpu, np.random.default_rng(1), SCALAR_SIZES)

    @pytest.mark.parametrize("unsigned, atomic_dq", [(False, False), (True, True)])
    def test_attention_register_tiled(unsigned, atomic_dq, monkeypatch) -> None:
        """The generated 64 x 64 tile kernels (tile=0), over two query tiles and a diagonal."""
        from euler.gpu import attention_tiles
        from euler.gpu.backend import GpuBackend

        monkeypatch.setattr(attention_tiles, "UNSIGNED_OFFSETS", unsigned)
        monkeypatch.setattr(attention_tiles, "ATOMIC_DQ", atomic_dq)

        gpu = GpuBackend(tf32=False, threads=32, blas=NumpyBlas())
        sizes = SimpleNamespace(B=1, T=70, H=2, G=1, E=8)
        check_attention(CpuBackend(), gpu, np.random.default_rng(3), sizes)
