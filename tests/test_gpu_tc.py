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
        ):
            with pytest.raises(ValueError, match=f"TcOptions.{field}"):
                TcOptions(**kwargs)

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

    test_ptx_in_background = background_test(
        __file__,
        "not slow",
        False,
        "This file's PTX checks at head size 16, in a subprocess started at collection.",
    )
    test_ptx_in_background_slow = background_test(
        __file__, "slow", False, "The PTX checks at head sizes 8 and 64 (minutes of NVVM)."
    )
    test_in_simulator = background_test(
        __file__,
        "not slow",
        True,
        "This file's simulator tests, in a subprocess started at collection.",
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
            (1, 70, 1, 1, 16),
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
