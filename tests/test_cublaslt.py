"""euler/gpu/cublaslt.py's calls, checked against a host-memory stand-in for the library.

The device run is in test_gpu_device.py; here FakeLt (fake_cublaslt.py) reads the ctypes
arguments as cuBLASLt would and computes D on host arrays reached through their
addresses, so the row-major to column-major mapping (operands swapped, TRANSA from
trans_b, layouts and their data types, compute type, C and D pointers, alpha and beta) is
checked without a GPU, for float32 and bf16 (uint16 bits) products.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fake_cublaslt import FakeLt, HostArray

from euler.gpu import cublaslt
from euler.gpu.cublas import CublasError
from euler.precision import BF16, from_bf16, to_bf16

STREAM = 0xABC0
M, N, K = 5, 3, 7  # all different, so a swapped operand or transpose cannot fit
F32, BF = cublaslt.CUDA_R_32F, cublaslt.CUDA_R_16BF


def make(monkeypatch, fake: FakeLt, tf32: bool = True, workspace_bytes: int = 1 << 20):
    monkeypatch.setattr(cublaslt, "load_library", lambda: fake)
    workspace = HostArray(np.zeros(workspace_bytes, np.uint8))
    return cublaslt.CublasLt(STREAM, workspace, tf32=tf32), workspace


def operands(rng, trans_a: bool, trans_b: bool):
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    return a, b


def addr(x: HostArray) -> int:
    return x.__cuda_array_interface__["data"][0]


@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False),
                                              (True, True)])  # fmt: skip
def test_gemm_is_the_row_major_product(monkeypatch, trans_a, trans_b, with_c) -> None:
    fake = FakeLt()
    lt, workspace = make(monkeypatch, fake)
    rng = np.random.default_rng(int(trans_a) + 2 * int(trans_b))
    a, b = operands(rng, trans_a, trans_b)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    A, B, C = HostArray(a.copy()), HostArray(b.copy()), HostArray(c0.copy())
    out = HostArray(np.full((M, N), np.nan, np.float32))  # beta 0 must not read it
    lt.gemm(out, A, B, trans_a, trans_b, c=C if with_c else None)
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    want += c0 if with_c else 0
    np.testing.assert_allclose(out.host, want, rtol=1e-6, atol=1e-6)
    # the inputs are only read: c above all, the point of C != D
    np.testing.assert_array_equal(C.host, c0)
    np.testing.assert_array_equal(A.host, a)
    np.testing.assert_array_equal(B.host, b)
    (call,) = fake.matmuls
    assert (call.alpha, call.beta) == (1.0, 1.0 if with_c else 0.0)
    assert call.d == addr(out) and call.c == (addr(C) if with_c else addr(out))
    assert (call.stream, call.workspace, call.workspace_bytes) == (
        STREAM, addr(workspace), workspace.nbytes)  # fmt: skip
    assert call.compute == cublaslt.COMPUTE_32F_FAST_TF32
    assert call.types == (F32, F32, F32, F32)
    lt.close()
    assert fake.objects == {}


@pytest.mark.parametrize("mode", ["assign", "accumulate", "c"])
@pytest.mark.parametrize("out_dtype", [np.float32, BF16], ids=["out_f32", "out_bf16"])
@pytest.mark.parametrize("trans_a, trans_b", [(False, True), (True, False)])
def test_bf16_operands(monkeypatch, trans_a, trans_b, out_dtype, mode) -> None:
    """bf16 A and B (16BF layouts, CUBLAS_COMPUTE_32F even with tf32 on, float scalars), out
    float32 or bf16 (C and D in out's type), assigned, accumulated in place (beta 1,
    C = D = out) or plus c (C = c)."""
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake, tf32=True)
    rng = np.random.default_rng(10 + int(trans_a))
    a, b = (to_bf16(x) for x in operands(rng, trans_a, trans_b))
    init = rng.standard_normal((M, N)).astype(np.float32)
    init = to_bf16(init) if out_dtype == BF16 else init
    A, B, out = HostArray(a.copy()), HostArray(b.copy()), HostArray(init.copy())
    C = HostArray(init[::-1].copy()) if mode == "c" else None
    lt.gemm(out, A, B, trans_a, trans_b, accumulate=mode == "accumulate", c=C)
    wide = lambda x: from_bf16(x).astype(np.float64) if x.dtype == BF16 else x.astype(np.float64)
    want = (wide(a).T if trans_a else wide(a)) @ (wide(b).T if trans_b else wide(b))
    want += {"assign": 0, "accumulate": wide(init), "c": wide(init[::-1])}[mode]
    if out_dtype == BF16:  # fp32 accumulators rounded once to nearest even
        np.testing.assert_array_equal(out.host, to_bf16(want.astype(np.float32)))
    else:
        np.testing.assert_allclose(out.host, want, rtol=1e-6, atol=1e-6)
    (call,) = fake.matmuls
    out_type = BF if out_dtype == BF16 else F32
    assert call.types == (BF, BF, out_type, out_type)
    assert call.compute == cublaslt.COMPUTE_32F
    assert (call.alpha, call.beta) == (1.0, 0.0 if mode == "assign" else 1.0)
    assert call.d == addr(out) and call.c == (addr(C) if C is not None else addr(out))
    lt.close()
    assert fake.objects == {}


def test_plans_are_keyed_by_dtypes(monkeypatch) -> None:
    """One plan (a heuristic query) per operand and output dtype of a shape; accumulating
    reuses the assigning call's plan (same layouts, only beta differs)."""
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake, tf32=False)
    a, b = operands(np.random.default_rng(5), False, True)
    f32 = lambda: HostArray(np.zeros((M, N), np.float32))
    bf = lambda: HostArray(np.zeros((M, N), BF16))
    products = [
        (f32(), HostArray(a), HostArray(b)),
        (f32(), HostArray(to_bf16(a)), HostArray(to_bf16(b))),
        (bf(), HostArray(to_bf16(a)), HostArray(to_bf16(b))),
    ]
    for n, args in enumerate(products, 1):
        lt.gemm(*args, trans_b=True)
        assert fake.heuristic_calls() == n
    for args in products:
        lt.gemm(*args, trans_b=True)
        lt.gemm(*args, trans_b=True, accumulate=True)
    assert fake.heuristic_calls() == 3 and len(fake.matmuls) == 9
    computes = [m.compute for m in fake.matmuls[:3]]
    assert computes == [cublaslt.COMPUTE_32F] * 3  # exact fp32, then bf16's fp32 accumulate
    assert [m.types[3] for m in fake.matmuls[:3]] == [F32, F32, BF]
    lt.close()
    assert fake.objects == {}


def test_dtype_refusals(monkeypatch) -> None:
    """Mixed operands, dtypes other than float32 and bf16, a bf16 out of float32 operands,
    c of another dtype than out, and c with accumulate: ValueErrors naming the argument,
    before anything reaches the library."""
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake)
    a, b = operands(np.random.default_rng(6), False, False)
    fa, fb, ba, bb = HostArray(a), HostArray(b), HostArray(to_bf16(a)), HostArray(to_bf16(b))
    f32, bf = HostArray(np.zeros((M, N), np.float32)), HostArray(np.zeros((M, N), BF16))
    refusals = [
        ((f32, ba, fb), {}, "b is float32 but a is uint16"),
        ((f32, fa, bb), {}, "b is uint16 but a is float32"),
        ((f32, HostArray(a.astype(np.float64)), fb), {}, "a is float64"),
        ((f32, fa, HostArray(b.astype(np.float16))), {}, "b is float16"),
        ((HostArray(np.zeros((M, N), np.int32)), ba, bb), {}, "out is int32"),
        ((bf, fa, fb), {}, "out is bf16 but a and b are float32"),
        ((f32, ba, bb), {"c": bf}, "must match out"),
        ((f32, ba, bb), {"c": HostArray(np.ones((M, N), np.float32)), "accumulate": True},
         "c and accumulate"),
    ]  # fmt: skip
    for args, kwargs, msg in refusals:
        with pytest.raises(ValueError, match=msg):
            lt.gemm(*args, **kwargs)
    assert fake.heuristic_calls() == 0 and fake.matmuls == []
    lt.close()


def test_descriptors_and_algorithm_are_chosen_once_per_product(monkeypatch) -> None:
    """A call after the first of a product queries no heuristic (a CUDA graph captures it)."""
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake)
    rng = np.random.default_rng(0)
    a, b = (HostArray(x) for x in operands(rng, False, True))
    res, out = HostArray(np.ones((M, N), np.float32)), HostArray(np.zeros((M, N), np.float32))
    lt.gemm(out, a, b, trans_b=True, c=res)
    created = len(fake.objects)
    assert fake.heuristic_calls() == 1
    for _ in range(3):
        lt.gemm(out, a, b, trans_b=True, c=res)
    assert fake.heuristic_calls() == 1 and len(fake.objects) == created
    assert fake.calls[-1] == "cublasLtMatmul" and len(fake.matmuls) == 4
    lt.gemm(out, a, b, trans_b=True)  # without c: another plan
    assert fake.heuristic_calls() == 2
    a2, b2 = (HostArray(x) for x in operands(rng, True, True))
    lt.gemm(out, a2, b2, True, True, c=res)  # other transposes: another plan
    assert fake.heuristic_calls() == 3
    lt.close()
    assert fake.objects == {}
    lt.close()  # twice is harmless


def test_the_first_usable_algorithm_is_kept(monkeypatch) -> None:
    """Skipped: a state other than success, a workspace over ours, and (with c) one that
    cannot write D apart from C."""
    algos = [
        SimpleNamespace(state=15, workspace=0, out_of_place=True),
        SimpleNamespace(state=0, workspace=2 << 20, out_of_place=True),
        SimpleNamespace(state=0, workspace=256, out_of_place=False),
        SimpleNamespace(state=0, workspace=0, out_of_place=True),
    ]
    fake = FakeLt(algos)
    fake.cublasLtMatmulAlgoGetHeuristic.fn = _report_all(fake)
    lt, _ = make(monkeypatch, fake, workspace_bytes=1 << 20)
    a, b = (HostArray(x) for x in operands(np.random.default_rng(1), False, False))
    out, res = HostArray(np.zeros((M, N), np.float32)), HostArray(np.ones((M, N), np.float32))
    lt.gemm(out, a, b)
    lt.gemm(out, a, b, c=res)
    assert [m.algo for m in fake.matmuls] == [3, 4]


def _report_all(fake: FakeLt):
    """The heuristic returning every algorithm, the over-large workspace one included
    (cuBLASLt's own filter on the preference is not what is being tested)."""

    def heuristic(handle, desc, a, b, c, d, pref, requested, results, found_ref):
        fake.calls.append("cublasLtMatmulAlgoGetHeuristic")
        for i, algo in enumerate(fake.algos):
            r = results[i]
            r.algo.data[0], r.workspaceSize, r.state = i + 1, algo.workspace, algo.state
        found_ref._obj.value = len(fake.algos)
        return 0

    return heuristic


def test_no_usable_algorithm_is_an_error(monkeypatch) -> None:
    fake = FakeLt([SimpleNamespace(state=0, workspace=0, out_of_place=False)])
    lt, _ = make(monkeypatch, fake)
    a, b = (HostArray(x) for x in operands(np.random.default_rng(2), False, True))
    out, res = HostArray(np.zeros((M, N), np.float32)), HostArray(np.ones((M, N), np.float32))
    msg = "cublasLtMatmulAlgoGetHeuristic failed: CUBLAS_STATUS_NOT_SUPPORTED"
    with pytest.raises(CublasError, match=msg):
        lt.gemm(out, a, b, trans_b=True, c=res)
    lt.gemm(out, a, b, trans_b=True)  # in place the same algorithm is fine
    lt.close()
    assert fake.objects == {}  # the failed plan's descriptors were destroyed at once


def test_a_failed_call_names_the_function_and_status(monkeypatch) -> None:
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake)
    a, b = (HostArray(x) for x in operands(np.random.default_rng(3), False, False))
    out = HostArray(np.zeros((M, N), np.float32))
    fake.fail["cublasLtMatrixLayoutCreate"] = 7
    msg = "cublasLtMatrixLayoutCreate failed: CUBLAS_STATUS_INVALID_VALUE"
    with pytest.raises(CublasError, match=msg):
        lt.gemm(out, a, b)
    del fake.fail["cublasLtMatrixLayoutCreate"]
    fake.fail["cublasLtMatmul"] = 13
    with pytest.raises(CublasError, match="cublasLtMatmul failed: CUBLAS_STATUS_EXECUTION_FAILED"):
        lt.gemm(out, a, b)
    lt.close()
    assert fake.objects == {}
    fake = FakeLt()
    fake.fail["cublasLtMatmulPreferenceSetAttribute"] = 7
    with pytest.raises(CublasError, match=r"PreferenceSetAttribute\(MAX_WORKSPACE_BYTES\) failed"):
        make(monkeypatch, fake)
    assert fake.objects == {}  # the handle and the preference made before it are freed


def test_exact_fp32_and_argument_checks(monkeypatch) -> None:
    fake = FakeLt()
    lt, _ = make(monkeypatch, fake, tf32=False)
    a, b = (HostArray(x) for x in operands(np.random.default_rng(4), False, True))
    out = HostArray(np.zeros((M, N), np.float32))
    lt.gemm(out, a, b, trans_b=True)
    assert fake.matmuls[-1].compute == cublaslt.COMPUTE_32F
    with pytest.raises(ValueError, match="c may not overlap out"):
        lt.gemm(out, a, b, trans_b=True, c=out)
    both = np.zeros((M + 1, N), np.float32)  # c one row below out, sharing the rest
    with pytest.raises(ValueError, match="c may not overlap out"):
        lt.gemm(HostArray(both[:M]), a, b, trans_b=True, c=HostArray(both[1:]))
    with pytest.raises(ValueError, match="must match out"):
        lt.gemm(out, a, b, trans_b=True, c=HostArray(np.zeros((N, M), np.float32)))
    with pytest.raises(ValueError, match="gemm shapes"):
        lt.gemm(out, a, b)  # b needs its transpose
    with pytest.raises(ValueError, match="a must be 2-D"):
        lt.gemm(out, HostArray(np.zeros((1, M, K), np.float32)), b, trans_b=True)
    assert len(fake.matmuls) == 1


def test_missing_library_is_a_cublas_error(monkeypatch) -> None:
    monkeypatch.setattr(cublaslt, "library_candidates", lambda *a: ["/nonexistent/libcublasLt.so"])
    with pytest.raises(CublasError, match="cuBLASLt not found"):
        cublaslt.CublasLt(STREAM, HostArray(np.zeros(16, np.uint8)))


class FakeTimer:
    """cublaslt.AlgoTimer over FakeLt: each run() is timed as ms[algo id] of the call it
    made (None for every call after `live` of them: a graph capture began)."""

    def __init__(self, fake: FakeLt, ms: dict[int, float], live: int = 1 << 30):
        self.fake, self.ms, self.live = fake, ms, live
        self.timed: list[int] = []  # the algorithm of each timed run
        self.scratches: list[HostArray] = []

    def scratch(self, shape, dtype):
        self.scratches.append(HostArray(np.full(shape, np.nan, dtype)))
        return self.scratches[-1]

    def time(self, run):
        if len(self.timed) >= self.live:
            return None
        run()
        self.timed.append(self.fake.matmuls[-1].algo)
        return self.ms[self.timed[-1]]


def timed_lt(monkeypatch, fake: FakeLt, timer, candidates: int):
    monkeypatch.setattr(cublaslt, "load_library", lambda: fake)
    workspace = HostArray(np.zeros(1 << 20, np.uint8))
    return cublaslt.CublasLt(STREAM, workspace, candidates=candidates, timer=timer)


def usable(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(state=0, workspace=0, out_of_place=True) for _ in range(n)]


@pytest.mark.parametrize("mode", ["assign", "accumulate", "c"])
def test_the_fastest_of_the_candidates_is_kept(monkeypatch, mode) -> None:
    """candidates > 1: the first `candidates` usable algorithms timed in turn, each twice,
    into a scratch D (out and c untouched by them); the fastest runs the product once and
    every later call; an equal time keeps the earlier."""
    monkeypatch.setattr(cublaslt, "CHOSEN", {})
    fake = FakeLt(usable(5))
    timer = FakeTimer(fake, {1: 3.0, 2: 2.0, 3: 1.0, 4: 1.0, 5: 0.5})
    lt = timed_lt(monkeypatch, fake, timer, candidates=4)
    rng = np.random.default_rng(20)
    a, b = operands(rng, False, True)
    init = rng.standard_normal((M, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    out, C = HostArray(init.copy()), HostArray(c0.copy())
    kw = {"accumulate": mode == "accumulate", "c": C if mode == "c" else None}
    call = lambda: lt.gemm(out, HostArray(a), HostArray(b), trans_b=True, **kw)
    call()
    assert timer.timed == [1, 2, 3, 4, 1, 2, 3, 4]  # never the fifth: past `candidates`
    (d,) = timer.scratches
    assert all(m.d == addr(d) for m in fake.matmuls[:-1])
    last = fake.matmuls[-1]
    assert last.algo == 3 and last.d == addr(out)
    want = a.astype(np.float64) @ b.T + {"assign": 0, "accumulate": init, "c": c0}[mode]
    np.testing.assert_allclose(out.host, want, rtol=1e-6, atol=1e-6)  # added to once
    np.testing.assert_array_equal(C.host, c0)
    call()
    assert len(timer.timed) == 8 and fake.matmuls[-1].algo == 3
    lt.close()
    assert fake.objects == {}


def test_the_choice_holds_for_every_handle_of_the_process(monkeypatch) -> None:
    """A second CublasLt times nothing for a product already timed, and runs the same
    algorithm; another product, or another candidates count, is timed afresh."""
    monkeypatch.setattr(cublaslt, "CHOSEN", {})
    fake = FakeLt(usable(3))
    timer = FakeTimer(fake, {1: 2.0, 2: 1.0, 3: 3.0})
    a, b = (HostArray(x) for x in operands(np.random.default_rng(21), False, True))
    out = HostArray(np.zeros((M, N), np.float32))
    first = timed_lt(monkeypatch, fake, timer, candidates=3)
    first.gemm(out, a, b, trans_b=True)
    second = timed_lt(monkeypatch, fake, timer, candidates=3)
    second.gemm(out, a, b, trans_b=True)
    assert len(timer.timed) == 6 and [m.algo for m in fake.matmuls[-2:]] == [2, 2]
    second.gemm(out, a, b, trans_b=True, c=HostArray(np.ones((M, N), np.float32)))
    assert len(timer.timed) == 12  # with c: another product
    timed_lt(monkeypatch, fake, timer, candidates=2).gemm(out, a, b, trans_b=True)
    assert len(timer.timed) == 16
    for lt in (first, second):
        lt.close()


def test_untimed_choices_take_the_heuristics_first(monkeypatch) -> None:
    """candidates = 1, no timer, or a timer that cannot time now (a capture): the first
    usable algorithm, and nothing remembered for the process."""
    monkeypatch.setattr(cublaslt, "CHOSEN", {})
    fake = FakeLt(usable(3))
    a, b = (HostArray(x) for x in operands(np.random.default_rng(22), False, True))
    out = HostArray(np.zeros((M, N), np.float32))
    one = FakeTimer(fake, {1: 3.0, 2: 1.0, 3: 2.0})
    timed_lt(monkeypatch, fake, one, candidates=1).gemm(out, a, b, trans_b=True)
    timed_lt(monkeypatch, fake, None, candidates=3).gemm(out, a, b, trans_b=True)
    assert one.timed == [] and [m.algo for m in fake.matmuls] == [1, 1]
    capturing = FakeTimer(fake, {1: 3.0, 2: 1.0, 3: 2.0}, live=2)
    timed_lt(monkeypatch, fake, capturing, candidates=3).gemm(out, a, b, trans_b=True)
    assert fake.matmuls[-1].algo == 1 and cublaslt.CHOSEN == {}
    later = FakeTimer(fake, {1: 3.0, 2: 1.0, 3: 2.0})
    timed_lt(monkeypatch, fake, later, candidates=3).gemm(out, a, b, trans_b=True)
    assert len(later.timed) == 6 and fake.matmuls[-1].algo == 2
    with pytest.raises(ValueError, match="CublasLt candidates: 1 to 8, not 9"):
        timed_lt(monkeypatch, fake, None, candidates=9)
