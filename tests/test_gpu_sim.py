"""The GPU kernels in the CUDA simulator against the CPU engine, on tiny shapes (no GPU needed).

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the one test that
runs in the ordinary session reports this same file run again in a subprocess with it set
(started by conftest.py beside the session);
there the layer checks of test_gpu_device.py run on a GpuBackend whose blocks and tiles
are small (the simulator runs one Python thread per GPU thread) and whose matrix products
come from NumPy (cuBLAS cannot run in the simulator). Block reductions take their
shared-memory path here, since the simulator has no warp shuffles.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not IN_SIMULATOR:
    from tests.background import background_test

    test_kernels_in_simulator = background_test(
        __file__, "", True, "This file's simulator tests (started by conftest.py)."
    )
    test_kernels_in_simulator_slow = background_test(
        __file__, "slow", True, "This file's slow simulator tests (minutes each)."
    )

else:
    from backward_twins import BACKWARD_CHECKS
    from bf16_checks import BF16_CHECKS
    from test_gpu_device import (
        LAYER_CHECKS,
        check_adamw,
        check_attention,
        check_rmsnorm,
        check_rope,
        check_swiglu_residual,
        run_both,
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

    from numba import cuda  # a module global: the simulator swaps it per kernel

    @cuda.jit
    def rotate(out, fail):
        i = cuda.threadIdx.x
        tile = cuda.shared.array(64, np.int64)
        tile[i] = i
        cuda.syncthreads()
        if i >= 48:  # these leave; the barriers below still open for the others
            return
        v = tile[(i + 1) % 48]
        cuda.syncthreads()
        tile[i] = v
        cuda.syncthreads()
        if i == fail:
            raise ValueError("thread failed")
        out[cuda.blockIdx.x, i] = tile[i]

    def test_scheduler_keeps_the_simulators_barrier_rules() -> None:
        """simulator_scheduler.py: a barrier opens when every live thread waits (threads that
        returned count as arrived), shared arrays are one per source line, and one thread's
        exception aborts the block and reaches the launch."""
        out = np.zeros((3, 48), np.int64)
        rotate[3, 64](out, -1)
        np.testing.assert_array_equal(out, np.tile((np.arange(48) + 1) % 48, (3, 1)))
        with pytest.raises(ValueError, match="thread failed"):
            rotate[1, 64](out, 7)

    @pytest.mark.parametrize("check", LAYER_CHECKS, ids=lambda f: f.__name__[6:])
    def test_layer(check, gpu) -> None:
        check(CpuBackend(), gpu, np.random.default_rng(0), SIM_SIZES)

    @pytest.mark.parametrize("check", BF16_CHECKS, ids=lambda f: f.__name__[6:])
    def test_layer_bf16(check, gpu) -> None:
        """bf16 tensors against the CPU's emulation of them (bf16_checks.py)."""
        check(CpuBackend(), gpu, np.random.default_rng(0), SIM_SIZES)

    def test_training_steps() -> None:
        """Whole steps of a small model through Model and AdamW on the GPU backend: staged
        batches, head weights and learning rate read from device buffers; rows in 16-byte
        pieces (vector.py), as at the presets. The weight gradients 32 or more wide (qkv,
        gate/up, the heads) go through a transposed operand (GpuOptions.transpose_min_width
        32), the others (wo, w_down) straight."""
        from euler.gpu.backend import GpuBackend
        from euler.gpu.options import GpuOptions
        from euler.model.config import ModelConfig

        options = GpuOptions(transpose_weight_grads=True, transpose_min_width=32)
        gpu = GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas(), options=options)
        cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                          context=16, ffn_hidden=24)  # fmt: skip
        train_step_matches(gpu, cfg, B=1, T=8, steps=2, grad_rtol=1e-4)
        # the weight gradients went through the side stream's queue, all joined at the end
        assert gpu._side_count > 0 and gpu._side_pending == []
        assert any(key[0] == "weight_grad_operand" for key in gpu._scratch)

    def test_training_steps_tied() -> None:
        """Tied embeddings on the GPU backend: head 0 reads tok_emb (its transposed weight
        gradient accumulated into tok_emb's, then the embedding's scatter adds), as on the
        CPU; one head (no mtp_heads tensor) and two."""
        from euler.gpu.backend import GpuBackend
        from euler.gpu.options import GpuOptions
        from euler.model.config import ModelConfig

        options = GpuOptions(transpose_weight_grads=True, transpose_min_width=32)
        gpu = GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas(), options=options)
        for k in (1, 2):
            cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                              context=16, ffn_hidden=24, n_mtp=k, tie_embeddings=True)  # fmt: skip
            train_step_matches(gpu, cfg, B=1, T=8, steps=2, grad_rtol=1e-4)

    @pytest.mark.parametrize("M, N", [(24, 10), (10, 24)])  # b narrower, then a
    @pytest.mark.parametrize("accumulate", [False, True])
    def test_weight_gradient_through_a_transposed_operand(M, N, accumulate):
        from numba import cuda

        from euler.gpu.backend import GpuBackend
        from euler.gpu.options import GpuOptions

        options = GpuOptions(transpose_weight_grads=True, transpose_min_width=0)
        gpu = GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas(), options=options)
        rng = np.random.default_rng(2)
        a, b, out0 = (rng.standard_normal(s).astype(np.float32) for s in ((37, M), (37, N), (M, N)))
        out = cuda.to_device(out0)
        gpu.matmul_deferred(out, cuda.to_device(a), cuda.to_device(b), True, False, accumulate)
        gpu.wait_deferred()
        want = a.T @ b + (out0 if accumulate else 0)
        np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        assert any(key[0] == "weight_grad_operand" for key in gpu._scratch)

    def check_matmul_residual(cpu, gpu, rng, s) -> None:
        """out = res + a w^T on both backends: the output projections' forward."""
        N, D, F = s.B * s.T, s.D, s.F
        out, res, a, w = (rng.standard_normal(shape).astype(np.float32)
                          for shape in ((N, D), (N, D), (N, F), (D, F)))  # fmt: skip
        run_both(cpu, gpu, "matmul_residual", [out, res, a, w], {"out": 0})

    @pytest.mark.parametrize("fused", [False, True])
    def test_matmul_residual(fused) -> None:
        """The product into scratch, then the residual kernel; with GpuOptions.fused_residual
        on too, since a stand-in blas (no cuBLAS to fuse with) takes the same path."""
        from euler.gpu.backend import GpuBackend
        from euler.gpu.options import GpuOptions

        options = GpuOptions(fused_residual=fused)
        gpu = GpuBackend(tf32=False, threads=32, tile=4, blas=NumpyBlas(), options=options)
        check_matmul_residual(CpuBackend(), gpu, np.random.default_rng(4), SIM_SIZES)
        assert gpu._lt is None and any(k[0] == "matmul_residual" for k in gpu._scratch)

    class CublasLikeNumpyBlas(NumpyBlas):
        """NumpyBlas passing for a real cuBLAS (it takes a workspace), so that
        GpuOptions.fused_residual makes the backend open cuBLASLt."""

        tf32 = False

        def set_workspace(self, buf) -> None:
            pass

    def test_fused_residual_through_a_stand_in_cublaslt(monkeypatch) -> None:
        """GpuOptions.fused_residual's path: the backend's own CublasLt, its library the host-memory
        stand-in of test_cublaslt.py, in a layer check and a whole training step."""
        from fake_cublaslt import FakeLt

        from euler.gpu import backend, cublaslt
        from euler.model.config import ModelConfig

        fake = FakeLt()
        monkeypatch.setattr(cublaslt, "load_library", lambda: fake)
        # the simulator's device arrays are host arrays without __cuda_array_interface__
        monkeypatch.setattr(cublaslt, "_ptr", lambda x: x._ary.ctypes.data)
        blas = CublasLikeNumpyBlas()
        options = backend.GpuOptions(fused_residual=True)
        gpu = backend.GpuBackend(
            tf32=False, threads=32, tile=4, blas=blas, overlap=False, options=options
        )
        gpu.stream.handle = 0x5EA  # and its streams no CUstream
        check_matmul_residual(CpuBackend(), gpu, np.random.default_rng(5), SIM_SIZES)
        cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                          context=16, ffn_hidden=24)  # fmt: skip
        train_step_matches(gpu, cfg, B=1, T=8, steps=1, grad_rtol=1e-4)
        # one product for the check, then attn.wo and mlp.w_down of the layer's forward
        assert len(fake.matmuls) == 1 + 2 * cfg.n_layer
        assert all(m.beta == 1.0 and m.c != m.d and m.stream == 0x5EA for m in fake.matmuls)
        assert fake.heuristic_calls() == 3  # (22, 24, 16), then wo (8, 16, 16), w_down (8, 16, 24)
        assert not any(k[0] == "matmul_residual" for k in gpu._scratch)
        assert gpu._lt.workspace.nbytes == backend.CUBLAS_WORKSPACE

    def bf16_products(be, v: dict) -> None:
        """The bf16 products of a training step on the arrays v (x, w, dy bf16), each out
        as the model has it: bf16 assigned (qkv) and accumulated, float32 accumulated (a
        head's dX), a pair of a bf16 dX and a float32 weight gradient accumulated (deferred),
        and the float32 residual output of an output projection."""
        be.matmul(v["y"], v["x"], v["w"], trans_b=True)
        be.matmul(v["y_acc"], v["x"], v["w"], False, True, True)
        be.matmul(v["dx"], v["dy"], v["w"], accumulate=True)
        be.matmul_pair(
            (v["dh"], v["dy"], v["w"], False, False, False),
            (v["dw"], v["dy"], v["x"], True, False, True),
        )
        be.wait_deferred()
        be.matmul_residual(v["res_out"], v["res"], v["x"], v["w"])

    @pytest.mark.parametrize("route", ["stand_in", "cublaslt", "cublaslt_timed"])
    def test_bf16_products_match_the_cpu_emulation(route, monkeypatch) -> None:
        """bf16_products on uint16 device arrays equal the CPU backend's emulation bit for
        bit: the values are multiples of 1/4 below 4, so every float32 sum is exact and only
        the bf16 stores round. stand_in: NumpyBlas (the CPU's own products) behind the
        backend's routing, side stream included; cublaslt: the backend's CublasLt objects on
        the stream and on the side stream, their library the host-memory FakeLt;
        cublaslt_timed: the same with 3 algorithms a product, each product's first call
        timing them (StreamTimer) into a scratch D, which leaves every output as it was."""
        from fake_cublaslt import R_16BF, R_32F, FakeLt
        from numba import cuda

        from euler.gpu import backend, cublaslt
        from euler.gpu.cublas import Cublas
        from euler.precision import from_bf16, to_bf16

        candidates = 3 if route == "cublaslt_timed" else 1
        fake = FakeLt([SimpleNamespace(state=0, workspace=0, out_of_place=True)] * candidates)
        blas = NumpyBlas()
        if route != "stand_in":
            blas, real_on_stream = CublasLikeNumpyBlas(), backend._on_stream
            handles = iter(range(0x5EA, 0x600))

            def on_stream(library, stream, tf32, **kw):
                """The simulator's streams get a CUstream number; cuBLAS is the stand-in."""
                if not hasattr(stream, "handle"):
                    stream.handle = next(handles)
                return blas if library is Cublas else real_on_stream(library, stream, tf32, **kw)

            monkeypatch.setattr(backend, "_on_stream", on_stream)
            monkeypatch.setattr(cublaslt, "load_library", lambda: fake)
            monkeypatch.setattr(cublaslt, "_ptr", lambda x: x._ary.ctypes.data)
            monkeypatch.setattr(cublaslt, "CHOSEN", {})
        options = backend.GpuOptions(transpose_weight_grads=False, gemm_candidates=candidates)
        gpu = backend.GpuBackend(tf32=False, threads=32, tile=4, blas=blas, options=options)
        rng = np.random.default_rng(7)
        quarters = lambda *shape: (rng.integers(-15, 16, shape) / 4).astype(np.float32)
        T, K, N = 12, 8, 10
        shapes = {"x": (T, K), "w": (N, K), "dy": (T, N), "y": (T, N), "y_acc": (T, N),
                  "dx": (T, K), "dh": (T, K), "dw": (N, K), "res_out": (T, N),
                  "res": (T, N)}  # fmt: skip
        bf16 = {"x", "w", "dy", "y", "y_acc", "dh"}
        host = {k: to_bf16(quarters(*s)) if k in bf16 else quarters(*s) for k, s in shapes.items()}
        want = {k: a.copy() for k, a in host.items()}
        bf16_products(CpuBackend(), want)
        exact = from_bf16(host["x"]) @ from_bf16(host["w"]).T
        assert (from_bf16(want["y"]) != exact).any()  # some stores rounded
        dev = {k: cuda.to_device(a) for k, a in host.items()}  # no fill kernel: faster
        bf16_products(gpu, dev)
        for name, a in want.items():
            got = gpu.to_host(dev[name])
            assert got.dtype == a.dtype and np.array_equal(got, a), name
        if route == "stand_in":
            assert gpu._lt is None and gpu._side_lt is None
            return
        main, side = gpu.stream.handle, gpu.side[0].handle
        F, B = R_32F, R_16BF
        outs = {cublaslt._ptr(a) for a in dev.values()}
        calls = [m for m in fake.matmuls if m.d in outs]
        # 5 plans (y_acc shares y's), each timing 3 algorithms twice: one untimed call, 5 timed
        timed = 5 * 3 * 2 * (1 + backend.TIMED_CALLS) if candidates > 1 else 0
        assert len(fake.matmuls) - len(calls) == timed
        assert [(m.types[2:], m.beta, m.c == m.d, m.stream) for m in calls] == [
            ((B, B), 0.0, True, main),  # y
            ((B, B), 1.0, True, main),  # y_acc: C = D = out
            ((F, F), 1.0, True, main),  # dx
            ((B, B), 0.0, True, main),  # dh
            ((F, F), 1.0, True, side),  # dw, deferred
            ((F, F), 1.0, False, main),  # res_out: C = res
        ]
        assert all(m.types[:2] == (B, B) and m.compute == cublaslt.COMPUTE_32F
                   for m in fake.matmuls)  # fmt: skip
        # the simulator's events time every algorithm alike: the first is kept
        assert all(m.algo == 1 for m in calls)
        assert main != side and gpu._side_lt.stream.value == side

    @pytest.mark.parametrize("shape", [(70, 45), (33, 100), (64, 32), (128, 192), (132, 200)])
    def test_transpose(shape) -> None:
        """Tails in both directions of the 64 x 64 tiles; whole tiles by 16-byte pieces
        (128 x 192), and both kinds in one call (132 x 200)."""
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

    def test_bf16_launchers_refuse_other_dtypes() -> None:
        """A bf16 output beside an input of a dtype the model never passes is refused before
        any launch, naming the argument (a kernel would read its bytes as bf16 or float32);
        the transpose takes float32 only (bf16 weight gradients are never transposed)."""
        from euler.gpu import embedding, rmsnorm, swiglu, transpose

        u, f = (lambda *s, t=t: np.zeros(s, t) for t in (np.uint16, np.float32))
        tokens = np.zeros(4, np.int32)
        calls = [
            ("rmsnorm_forward: x is uint16", rmsnorm.rmsnorm_forward, u(4, 8), f(4), u(4, 8),
             f(8), 1e-5),
            ("rmsnorm_backward: dres is float32", rmsnorm.rmsnorm_backward, u(4, 8), f(8),
             f(4, 8), f(4, 8), f(4, 8), f(8), f(4), True, f(3, 8)),
            ("swiglu_forward: gu is float32", swiglu.swiglu_forward, u(4, 8), f(4, 16)),
            ("swiglu_backward: dh is float32", swiglu.swiglu_backward, u(4, 16), f(4, 8),
             u(4, 16)),
            ("embedding_backward: dwte is uint16", embedding.embedding_backward, u(5, 8),
             u(4, 8), tokens, False),
            ("transpose: src is uint16", transpose.transpose, f(8, 4), u(4, 8)),  # fp32 only
        ]  # fmt: skip
        for message, launcher, *args in calls:
            with pytest.raises(ValueError, match=message):
                launcher(*args)

    def test_rmsnorm_bf16_scalar_path(gpu) -> None:
        """check_rmsnorm_bf16 at a D of 4-element pieces but not 8: the element-by-element
        bf16 kernels (bf16_checks' swiglu and embedding checks take both paths themselves)."""
        from bf16_checks import check_rmsnorm_bf16

        sizes = SimpleNamespace(B=1, T=5, D=12)
        check_rmsnorm_bf16(CpuBackend(), gpu, np.random.default_rng(1), sizes)

    def test_rmsnorm_bf16_rows_held_in_registers(gpu, monkeypatch) -> None:
        """check_rmsnorm_bf16 at D = 512, two strips: the held-row kernels (rmsnorm.py's
        table), which the launchers take there and not at D = 1024 (the generic kernel).
        The read-twice variant's bits against them: bench/labs/rmsnorm_bf16_backward_gpu.py."""
        from bf16_checks import check_rmsnorm_bf16

        from euler.gpu import rmsnorm

        used = []
        for name in ("forward_kernel", "backward_kernel"):
            real = getattr(rmsnorm, name)
            monkeypatch.setattr(rmsnorm, name, lambda D, r=real, n=name: used.append(n) or r(D))
        assert rmsnorm.held_in_registers(512) and not rmsnorm.held_in_registers(1024)
        check_rmsnorm_bf16(CpuBackend(), gpu, np.random.default_rng(2),
                           SimpleNamespace(B=1, T=3, D=512))  # fmt: skip
        assert sorted(set(used)) == ["backward_kernel", "forward_kernel"]

    def test_gemm_candidates_reach_cublaslt(monkeypatch) -> None:
        """GpuOptions.gemm_candidates: each stream's CublasLt times that many algorithms
        with a StreamTimer on its own stream, one that declines while the backend captures
        a graph; 0 or more than the heuristic's 8 is refused."""
        from euler.gpu import backend
        from euler.gpu.backend import GpuBackend, StreamTimer
        from euler.gpu.options import GpuOptions

        made = lambda library, stream, tf32, **kw: SimpleNamespace(library=library, **kw)
        monkeypatch.setattr(backend, "_on_stream", made)
        blas = NumpyBlas()
        blas.tf32 = False  # read by the CublasLt made beside it
        be = GpuBackend(tf32=False, threads=64, blas=blas, options=GpuOptions(gemm_candidates=3))
        lt = be._make_lt(be.stream)
        assert lt.library is backend.CublasLt and lt.candidates == 3
        assert isinstance(lt.timer, StreamTimer) and lt.timer.stream is be.stream
        assert lt.timer.scratch((2, 3), np.uint16).shape == (2, 3)
        runs = []
        be.capturing = True
        assert lt.timer.time(lambda: runs.append(1)) is None and runs == []
        be.capturing = False
        assert lt.timer.time(lambda: runs.append(1)) is not None and len(runs) == 6
        for bad in (0, 9):
            with pytest.raises(ValueError, match=f"gemm_candidates: 1 to 8, not {bad}"):
                GpuOptions(gemm_candidates=bad)

    def test_each_backend_owns_its_attention_flags(monkeypatch) -> None:
        """The tensor-core backward's prep flags are a buffer of the backend that launches
        it: two backends pass two buffers, each its own at every call, zeroed before the
        launch (recorded, not run: the buffers are what is checked)."""
        from euler.gpu import attention
        from euler.gpu.backend import GpuBackend

        flags = []  # the dkv kernel's flags argument, launch by launch
        record = lambda kernel, grid, threads, stream, nbytes, *args: flags.append(args[9])  # noqa: E731
        monkeypatch.setattr(attention, "launch_dynamic", record)
        B, T, H, G, E = 1, 64, 2, 1, 8  # T a multiple of 64: the prep row and its flags
        first, second = (GpuBackend(threads=32, blas=NumpyBlas()) for _ in range(2))
        for be in (first, second, first):
            qkv, dqkv = (be.zeros((B, T, (H + 2 * G) * E), np.float32) for _ in range(2))
            out, dout = (be.zeros((B, T, H * E), np.float32) for _ in range(2))
            lse = be.zeros((B, H, T), np.float32)
            if flags:
                flags[0].copy_to_device(np.ones(flags[0].shape, np.int32))
            be.attention_backward(dqkv, dout, qkv, out, lse, H, G, E)
        assert flags[0] is not flags[1] and flags[2] is flags[0]
        assert flags[0].shape == (B * H,) and not flags[0].copy_to_host().any()

    # the 16-byte paths (D, F, E/2 multiples of 4), then the scalar ones
    TWIN_SIZES = {
        "vector": SimpleNamespace(B=1, T=6, D=12, F=8, V=16, H=4, G=2, E=8, K=3),
        "scalar": SimpleNamespace(B=1, T=5, D=10, F=6, V=13, H=2, G=1, E=6, K=2),
    }

    @pytest.mark.parametrize("sizes", TWIN_SIZES)
    @pytest.mark.parametrize("check", BACKWARD_CHECKS, ids=lambda f: f.__name__[6:])
    def test_backward_matches_numpy_twin(check, sizes, gpu) -> None:
        """The GPU layers' backward in float32 against the NumPy twins in float64
        (tests/backward_twins.py), within float32 rounding of a few short sums."""
        check(gpu, np.random.default_rng(8), np.float32, TWIN_SIZES[sizes], 1e-4, 1e-5)

    @pytest.mark.parametrize("threads", [24, 8, 4], ids=["rows", "generic", "generic-2d"])
    def test_rope_schedules(threads) -> None:
        """rope's 16-byte kernel gives rope_kernel's bits: blocks over whole rows (24
        threads: blocks (2, 6, 2), 2 rows of 6 heads, the last of 4 blocks half full); where
        a row's heads outgrow the block (8 threads, 4) the generic kernel takes it."""
        from numba import cuda

        from euler.gpu import rope

        B, T, H, G, E = 1, 7, 4, 2, 16
        rng = np.random.default_rng(6)
        x = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
        ang = rng.uniform(0, 6.3, (T + 2, E // 2))
        cos, sin = (cuda.to_device(f(ang).astype(np.float32)) for f in (np.cos, np.sin))
        want, got = cuda.to_device(x), cuda.to_device(x)
        rope.rope_kernel[1, (8, 4)](want, cos, sin, H + G, 2, np.float32(-1.0))
        rope.rope_backward(got, cos, sin, H, G, E, pos0=2, threads=threads)
        assert not np.array_equal(want.copy_to_host(), x)
        np.testing.assert_array_equal(got.copy_to_host(), want.copy_to_host())

    # the gpu preset's head size (64: tiles of 16 keys under blocks of 64 rows) runs with
    # -m slow, the GPU suite's on the hardware (test_attention_head_sizes)
    @pytest.mark.parametrize("E, H", [(8, 1), (5, 2), pytest.param(64, 2, marks=pytest.mark.slow)])
    def test_attention_readable_default_tiles(E, H) -> None:
        """The readable kernels (attention.py) at their own tiles (tile=0: 64 rows a block),
        forward and backward against the CPU kernel over two query blocks and a diagonal;
        two query heads a kv head (dK, dV summed over the group); E = 5: not a multiple of 8,
        nor even."""
        from euler.gpu.backend import GpuBackend

        gpu = GpuBackend(tf32=False, threads=32, blas=NumpyBlas())
        sizes = SimpleNamespace(B=1, T=70, H=H, G=1, E=E)
        check_attention(CpuBackend(), gpu, np.random.default_rng(3), sizes)

    @pytest.mark.parametrize(
        "H, E, max_threads",
        [(3, 8, 1024), (12, 64, 1024), (2, 128, 1024), (12, 32, 32)],
        ids=["partial-warp", "gpu-preset", "e128", "heads-split"],
    )
    def test_backward_prep(H, E, max_threads, monkeypatch) -> None:
        """attention.backward_prep: dsum = rowsum(dO O) per head, dQ's columns zeroed and
        the rest of dqkv untouched, whether a block's lanes fill whole warps (3 heads of 2
        lanes do not), and when a row's heads need several blocks."""
        from numba import cuda

        from euler.gpu import attention

        monkeypatch.setattr(attention, "PREP_MAX_THREADS", max_threads)
        B, T, G = 2, 3, 1
        rng = np.random.default_rng(4)
        dout, out = (rng.standard_normal((B, T, H * E)).astype(np.float32) for _ in range(2))
        dqkv = np.ones((B, T, (H + 2 * G) * E), np.float32)
        d_dqkv, d_dsum = cuda.to_device(dqkv), cuda.to_device(np.zeros((B, H, T), np.float32))
        attention.backward_prep(d_dqkv, d_dsum, cuda.to_device(dout), cuda.to_device(out), H, E)
        want = (dout * out).reshape(B, T, H, E).sum(-1).transpose(0, 2, 1)
        np.testing.assert_allclose(d_dsum.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        got = d_dqkv.copy_to_host()
        assert not got[..., : H * E].any() and (got[..., H * E :] == 1).all()

    def test_kv_cache_kernels_match_the_cpu(gpu) -> None:
        """euler/gpu/decode.py against the CPU backend's decode methods: rows of two slots
        (one fed two rows at once, one at position 3 of a cache filled before), E = 40
        spanning two lanes' elements, 3 query heads on one kv head, then rows over 300 and
        20 cached keys; a product's D = 70. A row computed alone has the bits it has beside
        others."""
        from numba import cuda

        rng = np.random.default_rng(6)
        S, H, G, E, C = 2, 3, 1, 40, 6
        qkv = rng.standard_normal((3, (H + 2 * G) * E)).astype(np.float32)
        slots, positions = np.array([1, 1, 0], np.int32), np.array([0, 1, 3], np.int32)
        caches = [rng.standard_normal((S, G, C, E)).astype(np.float32) for _ in range(2)]
        want = np.zeros((3, H * E), np.float32)
        cpu_caches = [c.copy() for c in caches]
        CpuBackend().decode_attention(want, qkv, *cpu_caches, slots, positions, H, G, E)
        out, dev_caches = cuda.to_device(np.zeros_like(want)), [cuda.to_device(c) for c in caches]
        gpu.decode_attention(out, cuda.to_device(qkv), *dev_caches, cuda.to_device(slots),
                             cuda.to_device(positions), H, G, E)  # fmt: skip
        np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        for got, ref in zip(dev_caches, cpu_caches, strict=True):
            np.testing.assert_array_equal(got.copy_to_host(), ref)
        # the last row again, alone: the same bits
        one = cuda.to_device(np.zeros((1, H * E), np.float32))
        gpu.decode_attention(one, cuda.to_device(qkv[2:]), *dev_caches, cuda.to_device(slots[2:]),
                             cuda.to_device(positions[2:]), H, G, E)  # fmt: skip
        assert one.copy_to_host().tobytes() == out.copy_to_host()[2:].tobytes()
        # a cache long enough for several runs of keys a warp: 300 keys (two rounds of the
        # block's 128, then 44: two warps without a key in the last round) and 20 (one run)
        C = 320
        caches = [rng.standard_normal((S, G, C, E)).astype(np.float32) for _ in range(2)]
        slots, positions = np.array([0, 1], np.int32), np.array([299, 19], np.int32)
        want = np.zeros((2, H * E), np.float32)
        cpu_caches = [c.copy() for c in caches]
        CpuBackend().decode_attention(want, qkv[:2], *cpu_caches, slots, positions, H, G, E)
        out, dev_caches = cuda.to_device(np.zeros_like(want)), [cuda.to_device(c) for c in caches]
        gpu.decode_attention(out, cuda.to_device(qkv[:2]), *dev_caches, cuda.to_device(slots),
                             cuda.to_device(positions), H, G, E)  # fmt: skip
        np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        x, w = (rng.standard_normal(s).astype(np.float32) for s in ((3, 70), (5, 70)))
        y, y1 = (
            cuda.to_device(np.zeros((3, 5), np.float32)),
            cuda.to_device(np.zeros((1, 5), np.float32)),
        )
        gpu.decode_linear(y, cuda.to_device(x), cuda.to_device(w))
        gpu.decode_linear(y1, cuda.to_device(x[1:2]), cuda.to_device(w))
        np.testing.assert_allclose(y.copy_to_host(), x @ w.T, rtol=1e-5, atol=1e-5)
        assert y1.copy_to_host().tobytes() == y.copy_to_host()[1:2].tobytes()

    def test_decode_linear_bits_do_not_depend_on_the_rows_beside(gpu) -> None:
        """decode_linear at 1, 3, 9 and 10 rows (each linear_shape: one feature of one row,
        one of 4 rows, 4 of 4 rows, with a tail of rows) and 12 or 5 features (4 a warp, or
        one where 4 do not divide them): every row has the bits it has alone."""
        from numba import cuda

        from euler.gpu import decode

        rng = np.random.default_rng(8)
        x = rng.standard_normal((10, 70)).astype(np.float32)
        assert {decode.linear_shape(n, M) for n in (3, 9) for M in (12, 5)} == {
            (1, 4, 4), (4, 4, 4), (1, 8, 4)}  # fmt: skip
        for M in (12, 5):
            w = cuda.to_device(rng.standard_normal((M, 70)).astype(np.float32))
            alone = []
            for i in range(10):
                y = cuda.to_device(np.zeros((1, M), np.float32))
                gpu.decode_linear(y, cuda.to_device(x[i : i + 1]), w)
                alone.append(y.copy_to_host())
            np.testing.assert_allclose(np.concatenate(alone), x @ w.copy_to_host().T,
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
            for n in (3, 9, 10):
                y = cuda.to_device(np.zeros((n, M), np.float32))
                gpu.decode_linear(y, cuda.to_device(x[:n]), w)
                assert y.copy_to_host().tobytes() == np.concatenate(alone[:n]).tobytes(), (n, M)

    def test_kv_cache_decoder_matches_the_cpu(gpu) -> None:
        """A BatchDecoder on the GPU backend against the CPU's: hidden rows to float32
        rounding and the same greedy next tokens."""
        from euler.inference.batch import BatchDecoder
        from euler.model.config import ModelConfig
        from euler.model.transformer import Model

        cfg = ModelConfig(vocab_size=24, d_model=16, n_head=2, n_kv_head=1, n_layer=1,
                          context=8, ffn_hidden=8, init_std=0.5)  # fmt: skip
        params = Model(cfg, seed=4).params
        feeds = [(1, [3, 1]), (0, [9])]
        cpu, dev = BatchDecoder(cfg, params, 2), BatchDecoder(cfg, params, 2, backend=gpu)
        want, got = cpu.feed(feeds), dev.feed(feeds)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        rows = np.concatenate(got)
        assert (dev.logits(rows).argmax(1) == cpu.logits(np.concatenate(want)).argmax(1)).all()
