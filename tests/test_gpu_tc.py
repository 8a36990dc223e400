"""Tensor-core attention (attention_tc on mma.py): sm_90 PTX, and its numbers in the simulator.

Without a GPU: the kernels compile to sm_90 PTX that carries the mma.sync and cvt.rna.tf32
instructions (and no float64 or local memory); then this file runs again in a subprocess
with NUMBA_ENABLE_CUDASIM=1 (which must be set before numba.cuda is imported), where mma.py
emulates the warp-wide instruction. There the emulated m16n8k8 equals a float64 product of
TF32-rounded operands, ldmatrix_x4 hands each lane the words mma.py documents, and the
forward and backward on tiny shapes (one diagonal tile, two query tiles with a tail, two
whole tiles) match a float64 NumPy reference within TF32 tolerance.

Each combination of attention_tc's generation knobs (VARIANTS) compiles to PTX with its own
instructions (cp.async with PIPELINE, float atomics with ATOMIC_DQ, three mma a product
with SPLIT_TF32) and is checked in the simulator on the two-query-tile shape with two
query heads per kv head, where the pipelined dkv loop crosses from one head to the next
(the backward only, from the reference's out and lse, where its forward is the default's).
The quick suite runs the default (the kernels that train) in the simulator, and 3xTF32 on
one query tile of two heads (its products and staging are its own; its loops are the
default's), and compiles the staged, 3xTF32 and libdevice-exp kernels too; `-m slow -k
simulator` runs the other variants, 3xTF32 on the full shape among them. The warpgroup
product of wgmma.py (tests/wgmma_probe.py) compiles to its sm_90a instructions, and its
simulator emulation matches NumPy through the layouts the GPU test checks on the hardware.

Tolerance: TF32 keeps 10 mantissa bits, so each rounded operand is off by up to 2^-11
(4.9e-4) relative; a sum of such products errs by about that times the scale of its
terms. We allow 2e-3 of the largest reference value of each output (4 TF32 units); a
wrong fragment layout, mask or key permutation errs by O(1). 3xTF32 drops only the lo lo
term (2^-22 relative): 2e-6, which TF32 alone misses by 200x.
"""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from tests.numpy_reference import attention_with_grads

IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TOL = 2e-3  # of the largest reference value, see the module docstring
TOL_SPLIT = 2e-6  # 3xTF32: fp32's level (2e-7 here); TF32 alone errs by about 4e-4
# attention_tc knob settings, by name; "default" must be the module's own (a test checks)
# (HEAVY_FIRST off but in the default, HEAVY_FIRST_FORWARD on in 3xtf32: both grid orders of
# both passes run in the quick suite)
_OFF = {"PIPELINE": False, "ATOMIC_DQ": False, "SPLIT_TF32": False, "FAST_EXP": False,
        "HEAVY_FIRST": False, "HEAVY_FIRST_FORWARD": False, "ADD_ROUND": False,
        "ATOMIC_WIDTH": 1, "WIDE": False, "ASYNC_Q": False, "STAGED_OUT": False,
        "ASYNC_KV": False, "FLAT": False, "EXP2_DKV": False, "LDSM": False,
        "LDSM_DQ": False, "PREP_BLOCKS": False, "PREP_READY_LOOP": False}  # fmt: skip
_SPLIT_HEADS_FIRST = {"SPLIT_TF32": True, "HEAVY_FIRST_FORWARD": True}
_ON = ("PIPELINE", "ATOMIC_DQ", "FAST_EXP", "HEAVY_FIRST", "HEAVY_FIRST_FORWARD", "ADD_ROUND",
       "ASYNC_Q", "STAGED_OUT", "ASYNC_KV", "FLAT", "EXP2_DKV", "LDSM", "PREP_BLOCKS",
       "PREP_READY_LOOP")  # fmt: skip
VARIANTS = {
    "default": _OFF | dict.fromkeys(_ON, True) | {"ATOMIC_WIDTH": 4},
    "staged": _OFF,
    "pipeline": _OFF | {"PIPELINE": True},
    "atomic-dq": _OFF | {"ATOMIC_DQ": True},
    "3xtf32": _OFF | {"PIPELINE": True, "ATOMIC_DQ": True} | _SPLIT_HEADS_FIRST,
    "libdevice-exp": _OFF | {"PIPELINE": True, "ATOMIC_DQ": True},
}
VARIANTS["cvt-round"] = VARIANTS["default"] | {"ADD_ROUND": False}
VARIANTS["tile-fastest"] = VARIANTS["default"] | {
    "HEAVY_FIRST": False,
    "HEAVY_FIRST_FORWARD": False,
}
# the defaults until session 17: dQ's atomics 2 columns a request, one dkv loop
VARIANTS["atomics-2"] = VARIANTS["default"] | {"ATOMIC_WIDTH": 2, "PREP_READY_LOOP": False}
VARIANTS["wide"] = VARIANTS["default"] | {"WIDE": True}
# the defaults of 2026-11-30, session 12: clamped 3-d copies, e^x in dkv, 32-bit B loads
VARIANTS["scalar-loads"] = VARIANTS["default"] | dict.fromkeys(("FLAT", "EXP2_DKV", "LDSM"), False)
VARIANTS["ldsm-dq"] = VARIANTS["default"] | {"LDSM_DQ": True}
# the defaults until session 16: the prep kernel before dkv, whatever T
VARIANTS["prep-kernel"] = VARIANTS["default"] | {"PREP_BLOCKS": False}
# The kernels that train run in the simulator in the quick suite (3xTF32 on a smaller shape,
# test_attention_tc_3xtf32_one_tile); the others wait for -m slow (about a minute a variant
# there). Their PTX is quick (seconds a variant at E = 8), but for the combinations whose
# kernels are parts of the staged ones.
QUICK = ("default",)
QUICK_PTX = (
    *QUICK,
    "3xtf32",
    "staged",
    "libdevice-exp",
    "cvt-round",
    "wide",
    "atomics-2",
    "scalar-loads",
    "ldsm-dq",
    "prep-kernel",
)


def _marked(names, quick=QUICK) -> list:
    return [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.fixture(params=_marked(VARIANTS, QUICK_PTX))
def variant(request, monkeypatch) -> dict:
    """Sets one VARIANTS entry's knobs on attention_tc for the test; returns them."""
    from euler.gpu import attention_tc

    for name, value in VARIANTS[request.param].items():
        monkeypatch.setattr(attention_tc, name, value)
    return VARIANTS[request.param]


if not IN_SIMULATOR:
    cuda = pytest.importorskip("numba.cuda")

    def _ptx_of_launches(monkeypatch, E: int) -> dict[str, str]:
        """sm_90 PTX of each kernel the launchers start at head size E, by kernel name."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from euler.gpu import attention, attention_tc

        calls = []
        monkeypatch.setattr(
            dispatcher.CUDADispatcher,
            "__getitem__",
            lambda self, cfg: lambda *args: calls.append((self, args)),
        )
        monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(
            compute_capability=(9, 0)
        ))  # fmt: skip
        monkeypatch.setattr(attention, "_raise_shared_limit", lambda *a: None)  # needs a GPU
        monkeypatch.setattr(attention_tc, "_flags", lambda n, stream: np.zeros(n, np.int32))
        f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        B, T, H, G = 2, 3, 4, 2
        qkv, out, lse = f32(B, T, (H + 2 * G) * E), f32(B, T, H * E), f32(B, H, T)
        attention_tc.attention_forward(out, lse, qkv, H, G, E)
        attention_tc.attention_backward(f32(*qkv.shape), out, qkv, out, lse, H, G, E, lse)
        ptx = {}
        for kernel, args in calls:
            name = kernel.py_func.__name__
            if name.endswith("_tc_kernel"):  # not attention.backward_prep's kernels
                sig = tuple(numba.typeof(a) for a in args)
                bounds = kernel.targetoptions.get("launch_bounds")  # MIN_BLOCKS
                # sm_90a, as numba-cuda compiles for a 9.x device
                cc = (9, 0, "a")
                ptx[name] = cuda.compile_ptx(kernel.py_func, sig, cc=cc, launch_bounds=bounds)[0]
        return ptx

    def _check_ptx(ptx: dict[str, str], E: int, knobs: dict) -> None:
        pipeline, atomic, split = knobs["PIPELINE"], knobs["ATOMIC_DQ"], knobs["SPLIT_TF32"]
        fast_exp = knobs["FAST_EXP"]
        # per 64 x 64 tile and warp: 8 E / 8 products for each of S and O (forward), of S,
        # dP and dQ (dq), of S, dP, dV and dK (dkv; and dQ with ATOMIC_DQ), all written
        # out; three mma each with SPLIT_TF32
        per_product = 8 * E // 8 * (3 if split else 1)
        want = {"forward": 2, "dkv": 4 + atomic} | ({} if atomic else {"dq": 3})
        assert len(ptx) == len(want), sorted(ptx)
        for name, n in want.items():
            text = next(p for k, p in ptx.items() if f"{name}_tc_kernel" in k)
            assert ".target sm_90" in text
            rows = 2 if knobs["WIDE"] and name == "forward" else 1  # a warp's 16-row A tiles
            # PREP_READY_LOOP: dkv's loop twice, with the flags' code and without
            prep = knobs["PREP_BLOCKS"] and name == "dkv"
            loops = 2 if prep and pipeline and knobs["PREP_READY_LOOP"] else 1
            mmas = re.findall(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", text)
            assert len(mmas) == rows * n * per_product * loops, (name, len(mmas))
            assert "cvt.rna.tf32.f32" in text, name
            # libdevice's expf reduces its argument with fma.rm; exp_approx is ex2 alone
            assert ("fma.rm.f32" not in text) == fast_exp, name
            assert "ex2.approx.ftz.f32" in text, name
            assert not re.search(r"\.f64\b", text), f"{name}: float64 arithmetic"
            assert ".local" not in text, f"{name}: a register tile spilled to local memory"
            copies = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", text)
            # two 64-row tiles of E floats per buffer fill, E / 8 copies each per thread, at
            # the prologue and in the loop; and Q's tile with ASYNC_Q
            wide = knobs["WIDE"] and name == "forward"  # its own staging and stores
            async_q = pipeline and knobs["ASYNC_Q"] and name == "forward" and not wide
            async_kv = pipeline and knobs["ASYNC_KV"] and name == "dkv"  # and K, V's
            extra = E // 8 if async_q else 2 * E // 8 if async_kv else 0
            # FLAT: the loop's copies a second time, by flat indices (16 bytes, no size), and
            # dkv's first query tile's too
            flat = pipeline and knobs["FLAT"] and not wide
            flats = (2 if name == "dkv" else 1) * 2 * E // 8 if flat else 0
            want_copies = 4 * E // 8 + extra + flats if pipeline else 0
            want_copies += (loops - 1) * (2 if flat else 1) * 2 * E // 8  # the second loop's
            # PREP_BLOCKS: the prep blocks' dO and O, three issues (two ahead, the loop's)
            want_copies += 3 * 2 * E // 8 if prep else 0
            assert len(copies) == want_copies, (name, len(copies))
            flags = ("ld.relaxed.gpu.global.s32", "fence.acq_rel.gpu", "red.relaxed.gpu.global.add")
            assert all((f in text) == prep for f in flags), name
            assert ("cp.async.wait_group 1;" in text) == (async_q or async_kv), name
            # STAGED_OUT: a warp's 16 rows of each output tile (out; dK and dV) leave through
            # shared memory, 16 bytes a lane: E / 8 loads and stores of each
            staged = pipeline and knobs["STAGED_OUT"] and name != "dq" and not wide
            vectors = E // 8 * {"forward": 1, "dkv": 2, "dq": 0}[name] if staged else 0
            zeros = E // 8 if prep else 0  # and the prep blocks' dQ zeros, read back dO and O
            assert len(re.findall(r"st\.global\.v4\.f32", text)) == vectors + zeros, name
            # LDSM_DQ and 4-column atomics (from E = 16): dkv reads K 16 bytes at a time (E /
            # 8 loads) to transpose it
            ldsm_dq = knobs["LDSM"] and knobs["LDSM_DQ"] and atomic and async_kv and not split
            width = knobs["ATOMIC_WIDTH"]
            quads = width == 4 and E >= 16 and not split and not ldsm_dq and atomic
            loads = vectors + (E // 8 if ldsm_dq or (quads and name == "dkv") else 0) + 2 * zeros
            assert len(re.findall(r"ld\.shared\.v4\.f32", text)) == loads, name
            assert ("cp.async.wait_group 0;" in text) == pipeline, name
            # dQ: 4 E / 8 values a lane, ATOMIC_WIDTH of them a request (4: from E = 16)
            width = 4 if quads else min(width, 2)
            vec = "" if width == 1 else rf"\.v{width}"
            adds = re.findall(rf"(?:red|atom)\.global\.add{vec}\.f32", text)
            want_adds = 4 * E // 8 // width if atomic and name == "dkv" else 0
            want_adds *= (2 if flat and width > 1 else 1) * loops  # FLAT's flat and clamped
            assert len(adds) == want_adds, (name, len(adds))
            # LDSM: the S (forward) and S^T, dP^T (dkv) products' B fragments four at a time
            ldsm = knobs["LDSM"] and not split and name != "dq"
            want_ldsm = E // 8 * {"forward": 4, "dkv": 8}[name] if ldsm else 0
            if ldsm_dq:
                # and dQ's: an A fragment a key block and pass, B pairs of column blocks
                want_ldsm += 8 * -(-E // 8 // 4) + 8 * (E // 8 // 2)
            want_ldsm *= loops
            ldsm_found = re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", text)
            assert len(ldsm_found) == want_ldsm, (name, len(ldsm_found))
            # tf32_finite: an add of 0x1000 and a mask per probability (forward: 16 x 64 of a
            # warp's tile, 32 a lane) and per probability and score gradient (backward);
            # ADD_ROUND: the add alone for both B values of each product on a cp.async tile
            # (forward: S and O; dkv: all but dQ's, whose K is staged)
            adds = len(re.findall(r"add\.s32\s+%r\d+, %r\d+, 4096;", text))
            masks = len(re.findall(r"and\.b32\s+%r\d+, %r\d+, -8192;", text))
            want_masks = 0 if split else rows * {"forward": 32, "dq": 32, "dkv": 64}[name] * loops
            assert masks == want_masks, (name, masks)
            # (WIDE: each B value, rounded once, feeds both row tiles' mma)
            raw = {"forward": 2, "dkv": 4, "dq": 3}[name] if knobs["ADD_ROUND"] else 0
            assert adds - masks == 2 * raw * per_product * loops, (name, adds, masks)

    def test_default_variant_is_the_modules() -> None:
        """VARIANTS["default"] names the knobs the package trains with."""
        from euler.gpu import attention_tc

        knobs = attention_tc.knobs()
        assert {k: knobs[k] for k in VARIANTS["default"]} == VARIANTS["default"]
        assert all(set(v) == set(VARIANTS["default"]) for v in VARIANTS.values())

    def test_ptx_sm90(monkeypatch, variant) -> None:
        """Head size 8: seconds of NVVM time per variant (its one column block takes dQ's
        atomics 2 columns a request; test_ptx_sm90_gpu_preset counts the 4-column ones)."""
        _check_ptx(_ptx_of_launches(monkeypatch, 8), 8, variant)

    def test_ptx_min_blocks(monkeypatch) -> None:
        """MIN_BLOCKS reaches ptxas as a launch bound (a register cap) on every kernel."""
        from euler.gpu import attention_tc

        monkeypatch.setattr(attention_tc, "MIN_BLOCKS", 3)
        for name, text in _ptx_of_launches(monkeypatch, 8).items():
            assert re.search(r"\.maxntid 128, 1, 1", text), name
            assert re.search(r"\.minnctapersm 3\b", text), name

    @pytest.mark.parametrize(
        "name", [n if n == "default" else pytest.param(n, marks=pytest.mark.slow) for n in VARIANTS]
    )
    def test_ptx_sm90_gpu_preset(monkeypatch, name) -> None:
        """Head size 64, the `gpu` preset's (1-2 minutes of NVVM time per variant): the
        default's kernels, which train, in the quick suite."""
        from euler.gpu import attention_tc

        for knob, value in VARIANTS[name].items():
            monkeypatch.setattr(attention_tc, knob, value)
        _check_ptx(_ptx_of_launches(monkeypatch, 64), 64, VARIANTS[name])

    def test_ablation_sources(monkeypatch) -> None:
        """bench/labs/attention_tc_ablation.py's edits of the default forward (head size 8): each
        removes or guards what it names and nothing else, and each compiles to PTX."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from bench.labs.attention_tc_ablation import ablations
        from euler.gpu import attention_tc

        monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(
            compute_capability=(9, 0)
        ))  # fmt: skip
        monkeypatch.setattr(attention_tc, "ASYNC_Q", False)  # as the script sets them
        monkeypatch.setattr(attention_tc, "STAGED_OUT", False)
        src = attention_tc.sources(8)["forward_tc_kernel"]
        got = ablations(src)
        lines = src.splitlines()
        staged = [x for x in lines if x.strip().startswith(("v0_", "sm[sb0"))]
        assert len(staged) == 2 * 64 * 8 // attention_tc.THREADS  # a load and a store each
        assert got["no-q-stage"].splitlines() == [x for x in lines if x not in staged]
        for name, n in (("no-store", 2), ("no-mask", 1)):
            changed = [a for a, b in zip(lines, got[name].splitlines(), strict=True) if a != b]
            assert len(changed) == n, name
        f32 = numba.float32[:, :, ::1]
        sig = (f32, f32, f32, numba.int64, numba.int64, numba.float32)
        for name, text in got.items():
            kernel = attention_tc._compile("forward_tc_kernel", text)
            assert "mma.sync" in cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0], name

    def test_ptx_prep_ready_loop(monkeypatch) -> None:
        """PREP_READY_LOOP's dkv kernel (E = 8) holds its loop twice: twice the default dkv's
        mma, and one flag read more (the pair's last unit's, at the start), so the second
        loop reads none."""
        from euler.gpu import attention_tc

        monkeypatch.setattr(attention_tc, "PREP_READY_LOOP", False)
        base = _ptx_of_launches(monkeypatch, 8)["backward_dkv_tc_kernel"]
        monkeypatch.setattr(attention_tc, "PREP_READY_LOOP", True)
        ready = _ptx_of_launches(monkeypatch, 8)["backward_dkv_tc_kernel"]
        mma, read = r"mma\.sync\.aligned", "ld.relaxed.gpu.global.s32"
        assert len(re.findall(mma, ready)) == 2 * len(re.findall(mma, base)) > 0
        assert ready.count(read) == base.count(read) + 1

    def test_parts_no_atomics_source(monkeypatch) -> None:
        """bench/labs/attention_backward_parts.py's dkv without dQ's adds (head size 8): only the
        tests in front of the atomics change, and the adds stay in the PTX, behind them."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from bench.labs.attention_backward_parts import no_atomics
        from euler.gpu import attention_tc

        monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(
            compute_capability=(9, 0)
        ))  # fmt: skip
        monkeypatch.setattr(attention_tc, "PREP_BLOCKS", False)  # as the bench compiles it
        name = "backward_dkv_tc_kernel"
        src = attention_tc.sources(8)[name]
        lines, got = src.splitlines(), no_atomics(src).splitlines()
        changed = [b for a, b in zip(lines, got, strict=True) if a != b]
        # rows g and g + 8 of the one column block at E = 8, and FLAT's whole-tile test
        assert len(changed) == 3
        assert all(x.strip().startswith(("if rq +", "if whole")) for x in changed)
        assert all("scale < T(0.0)" in x for x in changed)
        f32 = numba.float32[:, :, ::1]
        sig = (f32, f32, f32, f32, f32, numba.int64, numba.int64, numba.float32)
        kernel = attention_tc._compile(name, no_atomics(src))
        assert "red.global.add" in cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0]

    def test_wgmma_ptx(monkeypatch) -> None:
        """The warpgroup product (wgmma.py) compiles for sm_90a to its instructions: two
        products (the first overwriting, the second accumulating), each fenced, committed
        and waited for."""
        import numba
        import numba.cuda.dispatcher as dispatcher

        from tests.wgmma_probe import wgmma_probe_kernel

        monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(
            compute_capability=(9, 0)
        ))  # fmt: skip
        f2, f3 = numba.float32[:, ::1], numba.float32[:, :, ::1]
        sig = (f2, f2, f3, numba.int64, numba.int64)
        ptx = cuda.compile_ptx(wgmma_probe_kernel.py_func, sig, cc=(9, 0, "a"))[0]
        assert ".target sm_90a" in ptx
        products = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k8\.f32\.tf32\.tf32", ptx)
        assert len(products) == 2
        assert "setp.ne.b32 p, 0, 0;" in ptx and "setp.ne.b32 p, 1, 0;" in ptx  # first, then +=
        assert ptx.count("wgmma.fence.sync.aligned;") == 2
        assert ptx.count("wgmma.commit_group.sync.aligned;") == 2
        assert ptx.count("wgmma.wait_group.sync.aligned 0;") == 2
        assert "fence.proxy.async.shared::cta;" in ptx

    @pytest.mark.simulator_run(__file__, "not slow")
    def test_in_simulator(simulator_run_result) -> None:
        """This file's simulator tests, in a subprocess started at collection (conftest.py)."""
        rc, out = simulator_run_result
        assert rc == 0, out

    @pytest.mark.slow
    @pytest.mark.simulator_run(__file__, "slow")
    def test_in_simulator_slow(simulator_run_result) -> None:
        """The variants outside QUICK (about a minute each)."""
        rc, out = simulator_run_result
        assert rc == 0, out

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

    def test_wgmma_emulation_matches_numpy() -> None:
        """The simulator's warpgroup product reads A and B as wgmma.py documents (the GPU
        test checks the hardware the same way): two descriptor offset choices."""
        from tests.wgmma_probe import check_wgmma_product

        check_wgmma_product(144, 1152)
        check_wgmma_product(128, 256, seed=1)

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

    def _check_attention(B, T, H, G, E, forward: bool = True, backward: bool = True) -> None:
        """attention_tc's forward and backward (or either alone: the backward from the
        reference's out and lse) at the current knobs against the float64 reference (to TOL,
        or to TOL_SPLIT with 3xTF32)."""
        rng = np.random.default_rng(1)
        qkv = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
        dout = rng.standard_normal((B, T, H * E)).astype(np.float32)
        ref = attention_with_grads(qkv, dout, H, G, E)
        if forward:
            out = np.full((B, T, H * E), np.nan, np.float32)
            lse = np.full((B, H, T), np.nan, np.float32)
            attention_tc.attention_forward(out, lse, qkv, H, G, E)
        else:
            out, lse = (np.ascontiguousarray(x, np.float32) for x in ref[:2])
        dqkv = np.full_like(qkv, np.nan)
        if backward:
            dsum = np.full((B, H, T), np.nan, np.float32)
            attention_tc.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum)
        rel = TOL_SPLIT if attention_tc.SPLIT_TF32 else TOL
        n = 3 if backward else 2
        for name, got, want in zip(("out", "lse", "dqkv")[:n], (out, lse, dqkv)[:n], ref[:n],
                                   strict=True):  # fmt: skip
            tol = rel * np.abs(want).max()
            err = np.abs(got - want).max()  # NaN (a slot left unwritten) fails too
            assert err <= tol, f"{name}: max error {err:.2e} > {tol:.2e}"

    @pytest.mark.parametrize(
        "B,T,H,G,E",
        [(1, 19, 2, 1, 32), (1, 70, 2, 1, 8)],
        ids=["one-diagonal-tile", "two-query-tiles-with-tail"],
    )
    def test_attention_tc(B, T, H, G, E) -> None:
        """Two query heads a kv head: the dkv block's second head starts on a diagonal tile
        after a full one, so its dS^T tile holds another tile's values to overwrite."""
        _check_attention(B, T, H, G, E)

    @pytest.mark.parametrize("name", _marked(n for n in VARIANTS if n != "default"))
    def test_attention_tc_variant(monkeypatch, name) -> None:
        """Two query tiles with a tail, two query heads per kv head; the forward only where
        the variant's differs from the default's (staged, 3xTF32, libdevice's exp)."""
        for knob, value in VARIANTS[name].items():
            monkeypatch.setattr(attention_tc, knob, value)
        forward = name in ("staged", "3xtf32", "libdevice-exp", "wide")
        E = 16 if VARIANTS[name]["ATOMIC_WIDTH"] == 4 else 8  # two column blocks to interleave
        _check_attention(1, 70, 2, 1, E, forward=forward, backward=name != "wide")

    def test_attention_tc_whole_tiles() -> None:
        """Two whole query tiles (T = 128), one head: the forward's second block copies key
        tile 1 by FLAT's flat indices, dkv's first block query tile 1 likewise, and dQ's adds
        go flat, 4 columns a request at E = 16 (test_attention_tc's T = 70 takes the clamped
        copies of a partial tile, T = 19 the clamped 4-column adds)."""
        _check_attention(1, 128, 1, 1, 16)

    @pytest.mark.parametrize(
        "B,G,span,every,ready",
        [
            (1, 1, 2, 2, False),
            pytest.param(2, 2, 2, 4, False, marks=pytest.mark.slow),
            pytest.param(2, 2, 4, 1, False, marks=pytest.mark.slow),
            pytest.param(2, 2, 2, 2, True, marks=pytest.mark.slow),
        ],  # fmt: skip
        ids=["one-kv-head", "four-by-two", "four-by-four", "ready-loop"],
    )
    def test_attention_tc_prep_blocks(monkeypatch, B, G, span, every, ready) -> None:
        """PREP_BLOCKS on whole tiles: the dkv grid's first row writes dsum and dQ's zeros
        (both start as NaN here) for B batch elements and G kv heads of two query heads
        each, two query tiles, a prep block serving `span` of them and raising their flags
        `every` units; its dkv blocks wait on the units' flags, the second head's first
        tile among them (the variant test's T = 70 takes the prep kernel instead). With
        PREP_READY_LOOP a dkv block finding its pair prepared (here every block: the
        simulator runs the prep row first) takes the loop without flags."""
        for knob, value in VARIANTS["default"].items():
            monkeypatch.setattr(attention_tc, knob, value)
        monkeypatch.setattr(attention_tc, "PREP_SPAN", span)
        monkeypatch.setattr(attention_tc, "PREP_FLAG_EVERY", every)
        monkeypatch.setattr(attention_tc, "PREP_READY_LOOP", ready)
        _check_attention(B, 128, 2 * G, G, 8, forward=False)

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

    def test_attention_tc_wide_forward(monkeypatch) -> None:
        """WIDE's forward (two 16-row tiles a warp) to TF32's tolerance in the quick suite:
        one 128-row block over a 70-row sequence, whose first two warps skip the second key
        tile and whose last two mask it."""
        for knob, value in VARIANTS["wide"].items():
            monkeypatch.setattr(attention_tc, knob, value)
        _check_attention(1, 70, 2, 1, 8, backward=False)

    def test_attention_tc_3xtf32_one_tile(monkeypatch) -> None:
        """3xTF32 to fp32's tolerance in the quick suite: forward and backward of one query
        tile of two query heads on one kv head (a third of the variant test's blocks)."""
        for knob, value in VARIANTS["3xtf32"].items():
            monkeypatch.setattr(attention_tc, knob, value)
        _check_attention(1, 19, 2, 1, 8)
