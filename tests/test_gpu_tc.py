"""Tensor-core attention (euler.gpu.attention_tc on mma.py): sm_90 PTX, and its numbers in the
simulator.

Without a GPU: both kernels compile to sm_90a PTX (once per head size and test run, shared
by the assertions) that carries the instructions the design says, counted: mma.sync per
tile product, cp.async copies, ldmatrix, the 4-column dQ atomics, TF32 rounding, ex2.approx
and the prep blocks' flags, and no float64 or local memory. Head size 16 runs by default
(its dQ atomics are 4 columns wide, as at the `gpu` preset's 64); 8 and 64 (about three
minutes of NVVM) with -m slow; these compiles run in a subprocess beside the session
(conftest.py). The file runs again in a subprocess with NUMBA_ENABLE_CUDASIM=1 (which must
be set before numba.cuda is imported),
where mma.py emulates the warp-wide instructions: there the emulated m16n8k8 equals a
float64 product of TF32-rounded operands, ldmatrix_x4 hands each lane the words mma.py
documents, and forward and backward match a float64 NumPy reference within TF32 tolerance
on tiny shapes: a diagonal tile, two query tiles with a tail (attention.backward_prep
before dkv), and whole tiles (the dkv grid's prep blocks, at several prep shapes).

Tolerance: TF32 keeps 10 mantissa bits, so each rounded operand is off by up to 2^-11
(4.9e-4) relative; a sum of such products errs by about that times the scale of its
terms. We allow 2e-3 of the largest reference value of each output (4 TF32 units); a
wrong fragment layout, mask or key permutation errs by O(1).

bf16 (TcOptions(bf16=True)): its kernels' PTX at head size 16 (m16n8k16 bf16 mma, 16-byte
cp.async, ldmatrix .b16 and .trans, counted; 64 with -m slow); in the simulator the emulated
m16n8k16 equals float64 of the bf16 operands exactly, the .b16 ldmatrix layouts, and the
kernels against the CPU backend's bf16 emulation to TOL_BF16; on a GPU (marked gpu) the
`gpu` preset's heads against float64.
"""

from __future__ import annotations

import functools
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from tests.numpy_reference import attention_with_grads

IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
IN_BACKGROUND = os.environ.get("EULER_TEST_BACKGROUND") == "1"  # conftest.py's runs
TOL = 2e-3  # of the largest reference value, see the module docstring
# bf16 keeps 8 significant bits: rounding to nearest errs by up to 2^-8 (3.9e-3) relative.
# The bf16 kernels read the same bf16 inputs as the CPU emulation and multiply them exactly
# in float32, but round P and dS to bf16 inside (the emulation does not), and out is
# rounded to bf16 by both (so it may differ by one bf16 unit, 2^-7 relative, where the two
# float32 values straddle a rounding boundary). We allow 4 bf16 roundings, 2^-6 (1.6e-2),
# of the largest reference value of each output; a wrong fragment or ldmatrix pattern
# errs by O(1). The same bound holds against float64 of the bf16 inputs (the GPU test).
TOL_BF16 = 2.0**-6


if not IN_BACKGROUND:  # the session: quick checks, and the reports of the background runs
    pytest.importorskip("numba.cuda")
    from tests.background import background_test

    def test_options_are_checked() -> None:
        """A TcOptions the generator cannot serve fails at construction, naming the field."""
        from euler.gpu.attention_tc import TcOptions

        for kwargs, field in (
            ({"head_size": 128}, "head_size"),
            ({"head_size": 8, "prep_stages": 2}, "prep_stages"),
            ({"head_size": 64, "prep_stages": 4}, "prep_stages"),  # over dkv's shared memory
            ({"head_size": 8, "prep_flag_every": 3}, "prep_flag_every"),
            ({"head_size": 8, "prep_span": 0}, "prep_span"),
            ({"head_size": 8, "bf16": True}, "head_size"),  # a k16 step: E from 16
        ):
            with pytest.raises(ValueError, match=f"TcOptions.{field}"):
                TcOptions(**kwargs)

    def test_launchers_name_mismatched_dtypes() -> None:
        """A bf16 qkv picks the bf16 kernels, whose out and dout must be bf16 and whose
        lse, dsum and dqkv float32: each mismatch is named, before anything compiles."""
        from euler.gpu import attention_tc

        B, T, H, G, E = 1, 64, 2, 1, 16
        qkv = np.zeros((B, T, (H + 2 * G) * E), np.uint16)
        f32 = np.zeros((B, T, H * E), np.float32)
        lse = np.zeros((B, H, T), np.float32)
        with pytest.raises(ValueError, match=r"out is float32, not bf16"):
            attention_tc.attention_forward(f32, lse, qkv, H, G, E)
        with pytest.raises(ValueError, match=r"dqkv is uint16, not float32.*dout is float32"):
            attention_tc.attention_backward(qkv, f32, qkv, f32.view(np.uint16)[..., : H * E],
                                            lse, H, G, E, lse)  # fmt: skip
        with pytest.raises(ValueError, match=r"TcOptions.bf16: False, but qkv is uint16"):
            attention_tc.attention_forward(
                f32, lse, qkv, H, G, E, options=attention_tc.TcOptions(E)
            )

    def test_sources_follow_the_options() -> None:
        """The simulator's source differs from the GPU's only where the module says
        (quad reductions, the staged stores' barrier, dQ's B loads, the array's alignment),
        and the prep shape reaches the prep blocks' source."""
        from euler.gpu.attention_tc import TcOptions, sources

        real, sim = sources(TcOptions(16, simulator=False)), sources(TcOptions(16, simulator=True))
        assert "shfl_xor_sync" in real["forward_tc_kernel"]
        assert "shfl_xor_sync" not in sim["forward_tc_kernel"]
        assert "load2_shared" not in sim["backward_dkv_tc_kernel"]
        assert "alignment=16" not in sim["backward_dkv_tc_kernel"]
        dkv = sources(TcOptions(16, simulator=False, prep_span=4))["backward_dkv_tc_kernel"]
        assert "if cuda.blockIdx.x % 4:" in dkv and "pb3 = " in dkv

    @pytest.mark.gpu
    @pytest.mark.parametrize("B,T", [(2, 512), (2, 192)], ids=["gpu-preset", "three-tiles"])
    def test_bf16_attention_matches_float64(B, T) -> None:
        """The bf16 kernels on a GPU at the `gpu` preset's heads (E = 64, H = 12, G = 4)
        against float64 attention of the same bf16 inputs, to TOL_BF16 (bf16's 8-bit
        significand: P and dS rounded to bf16 inside, out stored as bf16), the backward
        twice into the same dqkv (dQ's atomics must start from the prep's zeros each time);
        T = 192: the prep blocks' flags over a sequence of three tiles."""
        from numba import cuda

        if not cuda.is_available():
            pytest.skip("no CUDA GPU")
        from euler.gpu import attention_tc
        from euler.precision import from_bf16, to_bf16
        from tests.numpy_reference import attention_with_grads

        H, G, E = 12, 4, 64
        rng = np.random.default_rng(T)
        qkv = to_bf16(rng.standard_normal((B, T, (H + 2 * G) * E)))
        dout = to_bf16(rng.standard_normal((B, T, H * E)))
        ref = attention_with_grads(from_bf16(qkv), from_bf16(dout), H, G, E)
        d_qkv, d_dout = cuda.to_device(qkv), cuda.to_device(dout)
        out = cuda.device_array((B, T, H * E), np.uint16)
        lse, dsum = (cuda.device_array((B, H, T), np.float32) for _ in range(2))
        dqkv = cuda.device_array(qkv.shape, np.float32)
        attention_tc.attention_forward(out, lse, d_qkv, H, G, E)
        for call in range(2):
            attention_tc.attention_backward(dqkv, d_dout, d_qkv, out, lse, H, G, E, dsum)
            got = (from_bf16(out.copy_to_host()), lse.copy_to_host(), dqkv.copy_to_host())
            for name, g, w in zip(("out", "lse", "dqkv"), got, ref, strict=True):
                err, tol = np.abs(g - w).max(), TOL_BF16 * np.abs(w).max()
                assert err <= tol, f"call {call}, {name}: max error {err:.2e} > {tol:.2e}"

    test_ptx_in_background = background_test(
        __file__,
        "not slow",
        False,
        "This file's PTX checks at head size 16, in a subprocess started by conftest.py.",
    )
    test_ptx_in_background_slow = background_test(
        __file__, "slow", False, "The PTX checks at head sizes 8 and 64 (minutes of NVVM)."
    )
    test_in_simulator = background_test(
        __file__,
        "not slow",
        True,
        "This file's simulator tests, in a subprocess started by conftest.py.",
    )
    test_in_simulator_slow = background_test(
        __file__,
        "slow",
        True,
        "The partial tiles at E = 8 and the prep blocks' other shapes (a minute or two each).",
    )


elif not IN_SIMULATOR:  # the PTX run
    cuda = pytest.importorskip("numba.cuda")

    @functools.cache
    def _ptx(E: int) -> dict[str, str]:
        """sm_90a PTX of both kernels at head size E (as numba-cuda compiles for a 9.x
        device), for the argument types the launchers pass, by kernel name."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from euler.gpu import attention_tc

        f3, i64 = numba.float32[:, :, ::1], numba.int64
        forward, dkv = attention_tc.kernels(attention_tc.TcOptions(E))
        sigs = {
            forward: (f3, f3, f3, i64, i64, numba.float32),
            dkv: (f3, f3, f3, f3, f3, i64, i64, numba.float32, f3, numba.int32[::1], i64),
        }
        with pytest.MonkeyPatch.context() as mp:  # device functions ask for the device's cc
            hopper = SimpleNamespace(compute_capability=(9, 0))
            mp.setattr(dispatcher, "get_current_device", lambda: hopper)
            return {
                k.py_func.__name__: cuda.compile_ptx(k.py_func, sig, cc=(9, 0, "a"))[0]
                for k, sig in sigs.items()
            }

    def _check_ptx(ptx: dict[str, str], E: int) -> None:
        # per 64 x 64 tile and warp: E products (8 key blocks, E / 8 k steps or column
        # blocks) for each of S and O (forward); of S^T, dP^T, dV, dK and dQ (dkv), whose
        # loop is written twice (with the prep flags' waits and without)
        assert sorted(ptx) == ["backward_dkv_tc_kernel", "forward_tc_kernel"]
        nb = E // 8  # 8-column blocks of a head
        quads = E >= 16  # dQ's atomics 4 columns a request (E = 8: 2)
        for name, products, loops in (("forward", 2, 1), ("dkv", 5, 2)):
            text = ptx[f"{'backward_' if name == 'dkv' else ''}{name}_tc_kernel"]
            dkv = name == "dkv"
            assert ".target sm_90a" in text
            mmas = re.findall(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", text)
            assert len(mmas) == products * E * loops, (name, len(mmas))
            assert "cvt.rna.tf32.f32" in text, name
            # exp2_approx is ex2 alone; libdevice's expf would reduce its argument with fma.rm
            assert "ex2.approx.ftz.f32" in text and "fma.rm.f32" not in text, name
            assert not re.search(r"\.f64\b", text), f"{name}: float64 arithmetic"
            assert ".local" not in text, f"{name}: a register tile spilled to local memory"
            # 16-byte copies: two 64-row tiles a buffer fill, nb per thread each, clamped
            # (prologue, loop) and flat (loop; dkv's first query tile too); the forward's Q
            # tile, dkv's K and V; dkv's second loop; the prep blocks' dO and O (three issues)
            copies = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", text)
            want = 7 * nb if not dkv else (4 + 2 + 4 + 4 + 6) * nb
            assert len(copies) == want, (name, len(copies))
            flags = ("ld.relaxed.gpu.global.s32", "fence.acq_rel.gpu", "red.relaxed.gpu.global.add")
            assert all((f in text) == dkv for f in flags), name
            assert "cp.async.wait_group 1;" in text and "cp.async.wait_group 0;" in text, name
            # a warp's 16 rows of each output tile (out; dK and dV) leave through shared
            # memory, 16 bytes a lane (nb loads and stores of each); the prep blocks store
            # dQ's zeros and read back dO and O 16 bytes at a time; dkv reads K so to
            # transpose it (quads)
            stores = nb * (3 if dkv else 1)
            assert len(re.findall(r"st\.global\.v4\.f32", text)) == stores, name
            loads = nb * (2 + 2 + quads if dkv else 1)
            assert len(re.findall(r"ld\.shared\.v4\.f32", text)) == loads, name
            # dQ: 4 nb values a lane, 4 (or 2) a request, flat and clamped
            width = 4 if quads else 2
            adds = re.findall(rf"(?:red|atom)\.global\.add\.v{width}\.f32", text)
            assert len(adds) == (4 * nb // width * 2 * loops if dkv else 0), (name, len(adds))
            # ldmatrix: the B fragments of S (forward), S^T and dP^T (dkv) four at a time
            ldsm = re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", text)
            assert len(ldsm) == nb * (8 if dkv else 4) * loops, (name, len(ldsm))
            # tf32_finite: an add of 0x1000 and a mask per probability (forward: 16 x 64 of a
            # warp's tile, 32 a lane) and per probability and score gradient (dkv); the add
            # alone (tf32_operand) for both B values of each product on a cp.async tile
            # (all but dkv's dQ, whose K was rounded in place)
            masks = len(re.findall(r"and\.b32\s+%r\d+, %r\d+, -8192;", text))
            assert masks == (64 if dkv else 32) * loops, (name, masks)
            rounds = len(re.findall(r"add\.s32\s+%r\d+, %r\d+, 4096;", text))
            raw = 4 if dkv else 2  # products on cp.async tiles
            assert rounds - masks == 2 * raw * E * loops, (name, rounds, masks)

    def test_ptx_sm90() -> None:
        """Head size 16: both kernels' instructions, counted."""
        _check_ptx(_ptx(16), 16)

    @functools.cache
    def _ptx_bf16(E: int) -> dict[str, str]:
        """_ptx for TcOptions(E, bf16=True): qkv, out and dout bf16 (uint16 bits)."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from euler.gpu import attention_tc

        f3, u3, i64 = numba.float32[:, :, ::1], numba.uint16[:, :, ::1], numba.int64
        forward, dkv = attention_tc.kernels(attention_tc.TcOptions(E, bf16=True))
        sigs = {
            forward: (u3, f3, u3, i64, i64, numba.float32),
            dkv: (f3, f3, u3, u3, f3, i64, i64, numba.float32, u3, numba.int32[::1], i64),
        }
        with pytest.MonkeyPatch.context() as mp:
            hopper = SimpleNamespace(compute_capability=(9, 0))
            mp.setattr(dispatcher, "get_current_device", lambda: hopper)
            return {
                k.py_func.__name__: cuda.compile_ptx(k.py_func, sig, cc=(9, 0, "a"))[0]
                for k, sig in sigs.items()
            }

    def _count(pattern: str, text: str) -> int:
        return len(re.findall(pattern, text))

    def _check_ptx_bf16(ptx: dict[str, str], E: int) -> None:
        """The bf16 kernels' instructions, counted as _check_ptx's: a k16 mma covers two
        of TF32's k8 steps, a 16-byte copy 8 elements, and every fragment of a tile is one
        ldmatrix.x4 of .b16 (.trans for a [k][n] tile)."""
        assert sorted(ptx) == ["backward_dkv_tc_kernel", "forward_tc_kernel"]
        nb, ck = E // 8, E // 16  # 8-column blocks; k16 steps (and copies a tile a thread)
        fwd, dkv = ptx["forward_tc_kernel"], ptx["backward_dkv_tc_kernel"]
        for name, text, products, loops in (("forward", fwd, 2, 1), ("dkv", dkv, 5, 2)):
            assert ".target sm_90a" in text
            mma = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32"
            assert _count(mma, text) == products * E // 2 * loops, name
            assert "tf32" not in text, name
            assert "ex2.approx.ftz.f32" in text and "fma.rm.f32" not in text, name
            assert not re.search(r"\.f64\b", text), f"{name}: float64 arithmetic"
            assert ".local" not in text, f"{name}: a register tile spilled to local memory"
            assert "cp.async.wait_group 1;" in text and "cp.async.wait_group 0;" in text, name
            # the same copies as TF32's (_check_ptx), 8 bf16 a copy: E / 16 a tile a thread
            copies = _count(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", text)
            assert copies == (7 if name == "forward" else 20) * ck, (name, copies)
        ld, trans = (
            r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16",
            r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16",
        )
        # forward: Q's A fragments, S's B (K), P V's B (V, .trans)
        assert _count(ld, fwd) == ck + 4 * ck and _count(trans, fwd) == 4 * ck
        # dkv: K's and V's A fragments; S^T's and dP^T's B (Q, dO) a loop; .trans: dV's and
        # dK's B (dO, Q), dQ's A (dS^T) and B (K) in HALF-block passes
        passes = -(-nb // 4)
        assert _count(ld, dkv) == 2 * ck + 2 * 4 * ck * 2
        assert _count(trans, dkv) == (2 * 4 * ck + 4 * (passes + nb // 2)) * 2
        # pack_bf16x2: P (forward: 32 a lane a tile) and out's pairs; P and dS (dkv)
        assert _count(r"cvt\.rn\.bf16x2\.f32", fwd) == 16 + 2 * nb
        assert _count(r"cvt\.rn\.bf16x2\.f32", dkv) == 32 * 2
        # out leaves 16 bytes a lane; dK, dV and the prep's zeros as float32 16 bytes a lane
        assert (
            _count(r"st\.global\.v4\.u32", fwd) == ck
            and _count(r"st\.global\.v4\.f32", dkv) == 3 * nb
        )
        assert _count(r"ld\.shared\.v4\.u32", dkv) == 2 * ck  # the prep's dO and O
        # dQ: 2 columns a request (the bf16 B fragment pairs keys, not columns), flat and
        # clamped, both loops
        assert _count(r"red\.global\.add\.v2\.f32", dkv) == 2 * nb * 2 * 2
        flags = ("ld.relaxed.gpu.global.s32", "fence.acq_rel.gpu", "red.relaxed.gpu.global.add")
        assert all(f in dkv and f not in fwd for f in flags)

    def test_ptx_sm90_bf16() -> None:
        """The bf16 kernels at head size 16: m16n8k16 bf16 mma, 16-byte cp.async, ldmatrix
        .b16, counted; no local memory."""
        _check_ptx_bf16(_ptx_bf16(16), 16)

    @pytest.mark.slow
    def test_ptx_sm90_bf16_gpu_preset() -> None:
        """The bf16 kernels at the `gpu` preset's head size, 64 (minutes of NVVM)."""
        _check_ptx_bf16(_ptx_bf16(64), 64)

    @pytest.mark.slow
    @pytest.mark.parametrize("E", [8, 64])
    def test_ptx_sm90_other_head_sizes(E) -> None:
        """Head size 8 (one column block: dQ's atomics 2 columns a request) and 64, the
        `gpu` preset's (about three minutes of NVVM)."""
        _check_ptx(_ptx(E), E)

else:
    from numba import cuda

    from euler.gpu import attention_tc
    from euler.gpu.mma import mma_tf32, tf32, tf32_round_host

    @cuda.jit
    def _mma_kernel(a, b, c, d):
        """d (16, 8) = a (16, 8) b (8, 8) + c, one warp, through the fragment layout."""
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        d0, d1, d2, d3 = mma_tf32(
            tf32(a[g, t]), tf32(a[g + 8, t]), tf32(a[g, t + 4]), tf32(a[g + 8, t + 4]),
            tf32(b[t, g]), tf32(b[t + 4, g]),
            c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1],
        )  # fmt: skip
        d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = d0, d1, d2, d3

    def test_ldmatrix_x4_layout() -> None:
        """Lane (g, t) receives word t of row g of each of the four 8 x 4-word matrices whose
        rows the lanes address (lane l: row l % 8 of matrix l // 8), as mma.py documents."""
        from numba import float32

        from euler.gpu.mma import ldmatrix_x4

        @cuda.jit
        def load(src, out):
            sm = cuda.shared.array(1024, float32)
            lane = cuda.threadIdx.x
            for k in range(32):
                sm[32 * lane + k] = src[32 * lane + k]
            cuda.syncthreads()
            m, r = lane // 8, lane % 8  # rows of matrix m: 32 words apart, m % 2 x 4 words in
            out[lane, 0], out[lane, 1], out[lane, 2], out[lane, 3] = ldmatrix_x4(
                sm, 32 * (8 * m + r) + 4 * (m % 2)
            )

        src = np.arange(1024, dtype=np.float32)
        out = np.zeros((32, 4), np.float32)
        load[1, 32](src, out)
        g, t = np.arange(32) // 4, np.arange(32) % 4
        want = np.stack([32 * (8 * m + g) + 4 * (m % 2) + t for m in range(4)], axis=1)
        np.testing.assert_array_equal(out, want)

    def test_tf32_rounding() -> None:
        """Nearest, ties away from zero, 10 mantissa bits."""
        one = np.float32(1.0)
        x = np.array([1 + 2**-11, -(1 + 2**-11), 1 + 2**-12, 1 + 3 * 2**-11, np.inf], np.float32)
        want = np.array([1 + 2**-10, -(1 + 2**-10), 1, 1 + 2**-9, np.inf], np.float32)
        np.testing.assert_array_equal(tf32_round_host(x), want)
        assert tf32(one + np.float32(2**-11)) == np.float32(1 + 2**-10)

    def test_mma_matches_numpy() -> None:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((16, 8)).astype(np.float32)
        b = rng.standard_normal((8, 8)).astype(np.float32)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        d = np.full((16, 8), np.nan, np.float32)
        _mma_kernel[1, 32](a, b, c, d)
        want = tf32_round_host(a).astype(np.float64) @ tf32_round_host(b) + c
        np.testing.assert_allclose(d, want, rtol=2**-23, atol=2**-22)  # float32 rounding
        assert np.abs(d - (a.astype(np.float64) @ b + c)).max() > 1e-5  # TF32 is coarser

    def test_tf32_operand_rounds_as_cvt_rna() -> None:
        """tf32_operand's bits, truncated as the tensor core does, are tf32's: ties away from
        zero, negatives, the largest floats (to inf) and inf itself."""
        from euler.gpu.mma import TF32_MASK, tf32_operand

        @cuda.jit
        def both(x, rounded, operand):
            i = cuda.grid(1)
            if i < x.size:
                rounded[i], operand[i] = tf32(x[i]), tf32_operand(x[i])

        big = np.frombuffer(np.uint32(0x7F7FF000).tobytes(), np.float32)[0]
        x = np.array([1 + 2**-11, -(1 + 2**-11), 1 + 2**-12, 1 + 3 * 2**-11, 3.14159, -2e-30,
                      big, np.finfo(np.float32).max, np.inf, -np.inf], np.float32)  # fmt: skip
        x = np.concatenate([x, np.random.default_rng(0).standard_normal(54).astype(np.float32)])
        rounded, operand = np.zeros_like(x), np.zeros_like(x)
        both[1, 64](x, rounded, operand)
        truncated = operand.view(np.uint32) & np.uint32(TF32_MASK)
        np.testing.assert_array_equal(truncated, rounded.view(np.uint32))
        assert (operand.view(np.uint32) != rounded.view(np.uint32)).any()  # not cleared

    @cuda.jit
    def _mma_bf16_kernel(a, b, c, d):
        """d (16, 8) = a (16, 16) b (16, 8) + c, one warp, through the m16n8k16 layout."""
        from euler.gpu.mma import mma_bf16, pack_bf16x2

        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        k = 2 * t
        d0, d1, d2, d3 = mma_bf16(
            pack_bf16x2(a[g, k], a[g, k + 1]), pack_bf16x2(a[g + 8, k], a[g + 8, k + 1]),
            pack_bf16x2(a[g, k + 8], a[g, k + 9]), pack_bf16x2(a[g + 8, k + 8], a[g + 8, k + 9]),
            pack_bf16x2(b[k, g], b[k + 1, g]), pack_bf16x2(b[k + 8, g], b[k + 9, g]),
            c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1],
        )  # fmt: skip
        d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = d0, d1, d2, d3

    def test_mma_bf16_matches_float64() -> None:
        """The emulated m16n8k16 bf16 product is exact: float32 of the float64 A B + C of
        the bf16-rounded operands (pack_bf16x2 rounds as euler.precision.round_bf16; the
        products of 8-bit significands and their sums are exact in float64 here)."""
        from euler.precision import round_bf16

        rng = np.random.default_rng(0)
        a = rng.standard_normal((16, 16)).astype(np.float32)
        b = rng.standard_normal((16, 8)).astype(np.float32)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        d = np.full((16, 8), np.nan, np.float32)
        _mma_bf16_kernel[1, 32](a, b, c, d)
        want = round_bf16(a).astype(np.float64) @ round_bf16(b) + c
        np.testing.assert_array_equal(d, want.astype(np.float32))
        assert np.abs(d - (a.astype(np.float64) @ b + c)).max() > 1e-3  # bf16 is coarser

    def test_ldmatrix_b16_layouts() -> None:
        """ldmatrix_x4_b16: lane (g, t) receives elements 2t, 2t + 1 of row g of each matrix
        (the low half the lower column); .trans: elements (2t, g) and (2t + 1, g)."""
        from numba import uint16

        from euler.gpu.mma import ldmatrix_x4_b16, ldmatrix_x4_trans_b16

        @cuda.jit
        def load(src, out):
            sm = cuda.shared.array(1024, uint16)
            lane = cuda.threadIdx.x
            for k in range(32):
                sm[32 * lane + k] = src[32 * lane + k]
            cuda.syncthreads()
            at = 32 * lane  # matrix m = lane // 8 is rows 8m.. of a 32-wide array, columns 0..7
            r = ldmatrix_x4_b16(sm, at)
            q = ldmatrix_x4_trans_b16(sm, at)
            for m in range(4):
                out[0, lane, m], out[1, lane, m] = r[m], q[m]

        src = np.arange(1024, dtype=np.uint16)
        out = np.zeros((2, 32, 4), np.uint32)
        load[1, 32](src, out)
        g, t, m = np.arange(32)[:, None] // 4, np.arange(32)[:, None] % 4, np.arange(4)
        element = lambda row, col: 32 * (8 * m + row) + col  # noqa: E731
        np.testing.assert_array_equal(out[0], element(g, 2 * t) | element(g, 2 * t + 1) << 16)
        np.testing.assert_array_equal(out[1], element(2 * t, g) | element(2 * t + 1, g) << 16)

    def _check_attention_bf16(B, T, H, G, E, backward: bool = True) -> None:
        """The bf16 kernels against the CPU backend's bf16 emulation (the same bf16 inputs
        widened, its float32 kernels, out rounded to bf16), to TOL_BF16; out, lse, dqkv and
        dsum start as garbage the kernels must overwrite."""
        from euler.cpu.backend import CpuBackend
        from euler.precision import from_bf16, to_bf16

        rng = np.random.default_rng(2)
        qkv = to_bf16(rng.standard_normal((B, T, (H + 2 * G) * E)))
        dout = to_bf16(rng.standard_normal((B, T, H * E)))
        cpu = CpuBackend()
        ref_out, ref_lse = np.zeros((B, T, H * E), np.uint16), np.zeros((B, H, T), np.float32)
        cpu.attention_forward(ref_out, ref_lse, qkv, H, G, E)
        out = np.full((B, T, H * E), 0x7FC0, np.uint16)  # NaN
        lse = np.full((B, H, T), np.nan, np.float32)
        attention_tc.attention_forward(out, lse, qkv, H, G, E)
        checks = [("out", from_bf16(out), from_bf16(ref_out)), ("lse", lse, ref_lse)]
        if backward:
            ref_dqkv = np.zeros(qkv.shape, np.float32)
            cpu.attention_backward(ref_dqkv, dout, qkv, ref_out, ref_lse, H, G, E)
            dqkv = np.full(qkv.shape, np.nan, np.float32)
            dsum = np.full((B, H, T), np.nan, np.float32)
            attention_tc.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum)
            checks.append(("dqkv", dqkv, ref_dqkv))
        for name, got, want in checks:
            tol = TOL_BF16 * np.abs(want).max()
            err = np.abs(got - want).max()  # NaN (a slot left unwritten) fails too
            assert err <= tol, f"{name}: max error {err:.2e} > {tol:.2e}"

    @pytest.mark.parametrize(
        "B,T,H,G,E,backward",
        [
            (1, 64, 2, 1, 16, True),
            (1, 19, 1, 1, 32, False),
            pytest.param(1, 128, 2, 1, 16, True, marks=pytest.mark.slow),
            pytest.param(2, 64, 4, 2, 32, True, marks=pytest.mark.slow),
            pytest.param(1, 70, 1, 1, 64, False, marks=pytest.mark.slow),
        ],
        ids=["diagonal-tile-two-heads", "forward-tail", "whole-tiles", "two-kv-heads-E32",
             "forward-two-tiles-tail-E64"],
    )  # fmt: skip
    def test_attention_tc_bf16(B, T, H, G, E, backward) -> None:
        """The bf16 forward and backward. T = 64, two query heads a kv head: the prep
        blocks, then dkv's loop over both heads' diagonal tiles. T = 19 (forward): one
        partial tile, its copies clamped, out's rows past the end unwritten. With -m slow:
        T = 128 (flat copies, an off-diagonal tile, the prep blocks' flags over two tiles),
        two batch elements and kv heads at E = 32, a partial second tile at E = 64."""
        _check_attention_bf16(B, T, H, G, E, backward)

    def _check_attention(B, T, H, G, E, options=None, forward: bool = True) -> None:
        """attention_tc's forward and backward (the backward alone, from the reference's out
        and lse, unless forward) against the float64 reference, to TOL. dsum and dqkv
        start as NaN: the prep (kernel or blocks) must write dsum and dQ's zeros."""
        rng = np.random.default_rng(1)
        qkv = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
        dout = rng.standard_normal((B, T, H * E)).astype(np.float32)
        ref = attention_with_grads(qkv, dout, H, G, E)
        if forward:
            out = np.full((B, T, H * E), np.nan, np.float32)
            lse = np.full((B, H, T), np.nan, np.float32)
            attention_tc.attention_forward(out, lse, qkv, H, G, E, options=options)
        else:
            out, lse = (np.ascontiguousarray(x, np.float32) for x in ref[:2])
        dqkv = np.full_like(qkv, np.nan)
        dsum = np.full((B, H, T), np.nan, np.float32)
        attention_tc.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, options=options)
        for name, got, want in zip(("out", "lse", "dqkv"), (out, lse, dqkv), ref[:3],
                                   strict=True):  # fmt: skip
            tol = TOL * np.abs(want).max()
            err = np.abs(got - want).max()  # NaN (a slot left unwritten) fails too
            assert err <= tol, f"{name}: max error {err:.2e} > {tol:.2e}"

    @pytest.mark.parametrize(
        "B,T,H,G,E",
        [
            (1, 19, 2, 1, 32),
            pytest.param(1, 70, 2, 1, 8, marks=pytest.mark.slow),
            # a whole tile and a partial one without prep blocks: one-diagonal-tile covers
            # the clamped 4-column atomics and whole-tiles the off-diagonal tile (20 s here)
            pytest.param(1, 70, 1, 1, 16, marks=pytest.mark.slow),
            pytest.param(1, 70, 2, 1, 16, marks=pytest.mark.slow),
            (1, 128, 1, 1, 16),
        ],
        ids=["one-diagonal-tile", "two-query-tiles-with-tail", "tail-4-column-atomics",
             "tail-4-column-atomics-two-heads", "whole-tiles"],
    )  # fmt: skip
    def test_attention_tc(B, T, H, G, E) -> None:
        """T = 19 and 70: attention.backward_prep, then dkv without prep blocks, its copies
        and dQ's adds clamped on the partial tile; two query heads a kv head (T = 19 by
        default, T = 70 with -m slow), so the dkv block's second head starts on a diagonal
        tile (after a full one at T = 70), and its dS^T tile holds another tile's values to
        overwrite. T = 128: two whole tiles, the prep blocks
        in the dkv grid, every copy and dQ's adds by flat indices."""
        _check_attention(B, T, H, G, E)

    @pytest.mark.parametrize(
        "B,G,span,every",
        [
            (1, 1, 2, 2),
            pytest.param(2, 2, 2, 4, marks=pytest.mark.slow),
            pytest.param(2, 2, 4, 1, marks=pytest.mark.slow),
        ],  # fmt: skip
        ids=["one-kv-head", "four-by-two", "four-by-four"],
    )
    def test_attention_tc_prep_blocks(B, G, span, every) -> None:
        """The dkv grid's first row writes dsum and dQ's zeros for B batch elements and G kv
        heads of two query heads each, two query tiles, a prep block serving `span` of them
        and raising their flags `every` units; the dkv blocks read the units' flags, the
        second head's first tile among them. (The simulator runs the prep row first, so
        every dkv block finds its pair prepared and takes the loop without the waits.)"""
        options = attention_tc.TcOptions(8, prep_span=span, prep_flag_every=every)
        _check_attention(B, 128, 2 * G, G, 8, options, forward=False)
