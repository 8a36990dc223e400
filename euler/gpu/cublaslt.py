"""A thin ctypes binding of cuBLASLt: row-major float32 and bf16 GEMMs, C input apart from D.

cublasLtMatmul computes D = alpha op(A) op(B) + beta C, reading C and writing D through
separate pointers, with each matrix's data type in its layout. GpuBackend uses it for two
things legacy cuBLAS (cublas.py) cannot do:
- out = res + a @ w^T, a residual add after an output projection, in one call that leaves
  res as it was (C = res, D = out): no product into a temporary, no add kernel reading it
  back (bench/labs/cublaslt_lab_gpu.py measures it);
- the bf16 products of --precision bf16: A and B bf16 (uint16 bits, euler.precision), D
  bf16 or float32 as its consumer needs, accumulated in fp32 (CUBLAS_COMPUTE_32F), as
  llm.c's are. out += a @ b (a weight gradient into the fp32 gradient buffer) is beta = 1
  with C = D = out, which cuBLASLt allows.

float32 operands take TF32 tensor cores or exact fp32 (the tf32 flag), as Cublas does;
cuBLASLt has no float32 x float32 -> bf16 product, so a bf16 out needs bf16 operands.

The row-major to column-major mapping is cublas.py's: row-major out (M, N) = op(a) @ op(b)
is the column-major out^T = op(b)^T op(a)^T, so cuBLASLt's A is our b, its B our a, m = N,
n = M; a row-major (r, c) array is the column-major (c, r) one with leading dimension c.

Each distinct product (shape, transposes, with or without a separate C, operand and output
dtypes) gets its descriptor, layouts and algorithm once, on its first call; later calls
reuse them (an accumulating call shares the plain call's plan: the heuristic sees layouts,
not beta). So a call captured into a CUDA graph queries nothing (the trainer runs a step
eagerly before capturing it: euler/training/step_graph.py), and the workspace is the
caller's device buffer, so cuBLASLt allocates nothing either.

The algorithm: the heuristic's estimate of the best is often not the fastest. With
`candidates` > 1 and a timer, the first call times up to that many of the heuristic's
usable algorithms on the real operands (into a scratch D) and keeps the fastest, for every
handle of the process (CHOSEN): a tenth off the `gpu` preset's bf16 products
(docs/measurements.md). The algorithms differ in
tiles, which leave the bits as they are, and in split-K, which changes the order of a
sum: two processes may choose differently, so their weight gradients may differ in the
last bits. A first call inside a graph capture, where nothing can be timed, takes the
heuristic's first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol

import numpy as np

from euler.gpu.cublas import _STATUS, CublasError, _ptr
from euler.gpu.libs import library_candidates
from euler.precision import BF16

# ---------------------------------------------------------------- header values (ABI)
# cublas_api.h: cublasOperation_t CUBLAS_OP_N = 0, CUBLAS_OP_T = 1; cublasComputeType_t
# CUBLAS_COMPUTE_32F = 68 (fp32 accumulate: exact fp32 for float32 operands, bf16 tensor
# cores for bf16 ones), CUBLAS_COMPUTE_32F_FAST_TF32 = 77 (float32 in and out, TF32 tensor
# cores, fp32 accumulate).
OP_N, OP_T = 0, 1
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
# library_types.h: cudaDataType_t CUDA_R_32F = 0, CUDA_R_16BF = 14 (a layout's matrix type;
# alpha and beta are CUDA_R_32F in every product here, the scale type of COMPUTE_32F).
CUDA_R_32F, CUDA_R_16BF = 0, 14
# the dtype of each array a product takes -> its layout's data type
DATA_TYPES = {np.dtype(np.float32): CUDA_R_32F, BF16: CUDA_R_16BF}
# cublasLt.h: cublasLtMatmulDescAttributes_t CUBLASLT_MATMUL_DESC_TRANSA = 3, _TRANSB = 4
# (int32_t holding a cublasOperation_t).
DESC_TRANSA, DESC_TRANSB = 3, 4
# cublasLtMatmulPreferenceAttributes_t CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 (uint64_t).
PREF_MAX_WORKSPACE_BYTES = 1
# cublasLtMatmulAlgoCapAttributes_t CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT = 4
# (int32_t): whether an algorithm may write D elsewhere than C. The heuristic sees layouts,
# not pointers, so it cannot know that C != D is wanted: a call with c asks each candidate.
CAP_OUT_OF_PLACE = 4
HEURISTIC_RESULTS = 8  # candidates asked for: the first usable one, or the fastest timed
TIMING_ROUNDS = 2  # rounds over the candidates; each one's best round counts
# product key, workspace bytes, candidates -> the algorithm chosen by timing (its 64 bytes)
CHOSEN: dict[tuple, bytes] = {}

LIB_NAME, LIB_SONAME = "cublasLt", "libcublasLt.so"


class AlgoTimer(Protocol):
    """What CublasLt times candidate algorithms with, on its handle's stream (GpuBackend's
    StreamTimer)."""

    def scratch(self, shape: tuple, dtype) -> object:
        """A device array (C-contiguous) for the timed calls' D; its values are not kept."""
        ...

    def time(self, run: Callable[[], None]) -> float | None:
        """Device ms of one run() on the stream, or None where nothing can be timed now (the
        stream is being captured into a graph)."""
        ...


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: typedef struct { uint64_t data[8]; } (64 bytes), opaque."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (cublasLt.h): cublasLtMatmulAlgo_t algo (64 bytes),
    size_t workspaceSize (8), cublasStatus_t state (an enum, 4), float wavesCount (4),
    int reserved[4] (16): 96 bytes, 8-aligned. cublasLtMatmulAlgoGetHeuristic fills an array
    of them; state is 0 for an algorithm that can run, workspaceSize what it needs."""

    _fields_ = [
        ("algo", MatmulAlgo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


# the sizes the header implies (and bench/labs/cublaslt_lab_gpu.py reads back): a mismatch
# would corrupt memory
STRUCT_SIZES = {MatmulAlgo: 64, HeuristicResult: 96}


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed: {_STATUS.get(status, f'status {status}')}")


def load_library() -> ctypes.CDLL:
    """The first cuBLASLt that loads (looked for as cuBLAS is), or a CublasError."""
    tried = library_candidates(LIB_NAME, LIB_SONAME)
    for path in tried:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise CublasError(f"cuBLASLt not found; tried {tried}")


def _declare(lib) -> None:
    """Argument and result types of the functions used (all return a cublasStatus_t)."""
    vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    u64, i64 = ctypes.c_uint64, ctypes.c_int64
    pvp, palgo = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(MatmulAlgo)
    signatures = {
        "cublasLtCreate": [pvp],
        "cublasLtDestroy": [vp],
        "cublasLtMatmulDescCreate": [pvp, i32, i32],  # desc*, compute type, scale type
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulDescDestroy": [vp],
        "cublasLtMatrixLayoutCreate": [pvp, i32, u64, u64, i64],  # type, rows, cols, ld
        "cublasLtMatrixLayoutDestroy": [vp],
        "cublasLtMatmulPreferenceCreate": [pvp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulPreferenceDestroy": [vp],
        # handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested, results*, found*
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32,
                                           ctypes.POINTER(HeuristicResult),
                                           ctypes.POINTER(ctypes.c_int)],
        "cublasLtMatmulAlgoCapGetAttribute": [palgo, i32, vp, sz, ctypes.POINTER(sz)],
        # handle, desc, alpha*, A, Adesc, B, Bdesc, beta*, C, Cdesc, D, Ddesc, algo*,
        # workspace, workspace bytes, stream
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, palgo, vp, sz, vp],
    }  # fmt: skip
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int


class _Plan:
    """One product's matmul descriptor, its three layouts and the algorithm chosen.

    ab_type: A's and B's data type (CUDA_R_32F or CUDA_R_16BF); out_type: C's and D's.
    """

    def __init__(self, ab_type: int = CUDA_R_32F, out_type: int = CUDA_R_32F):
        self.ab_type, self.out_type = ab_type, out_type
        self.desc = ctypes.c_void_p()
        self.a_layout = ctypes.c_void_p()  # cuBLASLt's A: our b
        self.b_layout = ctypes.c_void_p()  # cuBLASLt's B: our a
        self.cd_layout = ctypes.c_void_p()  # C and D: out^T, N x M column-major
        self.algo = MatmulAlgo()


class CublasLt:
    """One cuBLASLt handle issuing on one CUDA stream with the caller's workspace.

    stream_handle: the CUstream (an int) every product is enqueued on. workspace: a device
    buffer (uint8; the backend gives 32 MiB) kept referenced here and used by every call.
    tf32: float32 products in CUBLAS_COMPUTE_32F_FAST_TF32, else exact fp32
    (CUBLAS_COMPUTE_32F); bf16 products are CUBLAS_COMPUTE_32F either way. candidates
    (1 to HEURISTIC_RESULTS) and timer: how a product's algorithm is chosen (module doc);
    without a timer, or with 1, the heuristic's first usable one.
    """

    def __init__(
        self,
        stream_handle: int,
        workspace,
        tf32: bool = True,
        candidates: int = 1,
        timer: AlgoTimer | None = None,
    ):
        if not 1 <= candidates <= HEURISTIC_RESULTS:
            raise ValueError(f"CublasLt candidates: 1 to {HEURISTIC_RESULTS}, not {candidates}")
        self.candidates, self.timer = candidates, timer
        for struct, size in STRUCT_SIZES.items():
            if ctypes.sizeof(struct) != size:
                raise CublasError(f"{struct.__name__}: {ctypes.sizeof(struct)} bytes, not {size}")
        self.handle, self.pref = ctypes.c_void_p(), ctypes.c_void_p()
        self._plans: dict[tuple, _Plan] = {}
        self.lib = load_library()
        _declare(self.lib)
        self.stream = ctypes.c_void_p(stream_handle)
        self.workspace, self.tf32 = workspace, tf32
        self.compute = COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F  # of float32 operands
        # alpha and beta are read from host memory (the default pointer mode) when a call is
        # enqueued, and captured by value into a graph
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        """The handle and the algorithm preference: only algorithms that fit our workspace,
        so cuBLASLt never allocates one of its own."""
        lib = self.lib
        _check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        _check(
            lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)),
            "cublasLtMatmulPreferenceCreate",
        )
        limit = ctypes.c_uint64(self.workspace.nbytes)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(
                self.pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit), ctypes.sizeof(limit)
            ),
            "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
        )

    def gemm(
        self,
        out,
        a,
        b,
        trans_a: bool = False,
        trans_b: bool = False,
        accumulate: bool = False,
        *,
        c=None,
    ) -> None:
        """out (M, N) = op(a) (M, K) @ op(b) (K, N), assigned, accumulated (+=) or plus c
        (M, N); all row-major and C-contiguous, on the stream, fp32 accumulation.

        a and b: both float32 or both bf16 (uint16 bits); out float32 or (with bf16
        operands) bf16; c, when given, out's shape and dtype, only read, and may not overlap
        out (C != D); accumulate is C = D = out, so the two cannot be combined.
        """
        ab_type, out_type = _types(out, a, b)
        M, N, K = _dims(out, a, b, trans_a, trans_b)
        if c is not None:
            if accumulate:
                raise ValueError("gemm: c and accumulate together (accumulate is C = out)")
            if c.shape != out.shape or c.dtype != out.dtype or not c.is_c_contiguous():
                raise ValueError(f"gemm: c {c.shape} {c.dtype} must match out {out.shape}")
            if overlaps(c, out):
                raise ValueError("gemm: c may not overlap out")
        beta = self._zero if c is None and not accumulate else self._one
        key = (M, N, K, trans_a, trans_b, c is not None, ab_type, out_type)
        plan = self._plans.get(key)
        if plan is None:  # the first call: the timing closure is made only here

            def trial(plan: _Plan, algo: MatmulAlgo, d) -> None:
                """One call with algo into d (a scratch D): from c, or from d itself."""
                self._matmul(plan, algo, d, a, b, d if c is None else c, beta)

            plan = self._plan(key, trial)
        self._matmul(plan, plan.algo, out, a, b, out if c is None else c, beta)

    def _matmul(self, plan: _Plan, algo: MatmulAlgo, d, a, b, c, beta: ctypes.c_float) -> None:
        """cublasLtMatmul: D = op(a) @ op(b) + beta C with algo, on the stream."""
        _check(
            self.lib.cublasLtMatmul(
                self.handle, plan.desc, ctypes.byref(self._one),
                _ptr(b), plan.a_layout, _ptr(a), plan.b_layout,
                ctypes.byref(beta), _ptr(c), plan.cd_layout, _ptr(d), plan.cd_layout,
                ctypes.byref(algo), _ptr(self.workspace), self.workspace.nbytes, self.stream,
            ),
            "cublasLtMatmul",
        )  # fmt: skip

    def _plan(self, key: tuple, trial) -> _Plan:
        """The cached plan of the product key = (M, N, K, trans_a, trans_b, has_c, ab_type,
        out_type), made (and its algorithm chosen) on first use; trial(plan, algo, d) runs
        the product once with algo into d, for timing."""
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        M, N, K, trans_a, trans_b, has_c, ab_type, out_type = key
        plan = _Plan(ab_type, out_type)
        try:
            self._describe(plan, M, N, K, trans_a, trans_b)
            self._choose(plan, key, has_c, trial)
        except BaseException:
            self._destroy(plan)
            raise
        self._plans[key] = plan
        return plan

    def _describe(self, plan: _Plan, M: int, N: int, K: int, trans_a: bool, trans_b: bool):
        lib = self.lib
        compute = COMPUTE_32F if plan.ab_type == CUDA_R_16BF else self.compute
        _check(
            lib.cublasLtMatmulDescCreate(ctypes.byref(plan.desc), compute, CUDA_R_32F),
            "cublasLtMatmulDescCreate",
        )
        # swapped operands (see the module doc): cuBLASLt's op(A) is our op(b)^T
        ops = ((DESC_TRANSA, "TRANSA", trans_b), (DESC_TRANSB, "TRANSB", trans_a))
        for attr, name, trans in ops:
            op = ctypes.c_int32(OP_T if trans else OP_N)
            _check(
                lib.cublasLtMatmulDescSetAttribute(plan.desc, attr, ctypes.byref(op), 4),
                f"cublasLtMatmulDescSetAttribute({name})",
            )
        # each operand as stored: row-major (r, c) is column-major c x r with ld = c
        b_rows, b_cols = (N, K) if trans_b else (K, N)
        a_rows, a_cols = (K, M) if trans_a else (M, K)
        for layout, dtype, rows, cols in (
            (plan.a_layout, plan.ab_type, b_cols, b_rows),
            (plan.b_layout, plan.ab_type, a_cols, a_rows),
            (plan.cd_layout, plan.out_type, N, M),
        ):
            _check(
                lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, rows),
                "cublasLtMatrixLayoutCreate",
            )

    def _choose(self, plan: _Plan, key: tuple, has_c: bool, trial) -> None:
        """plan.algo = of the heuristic's results that can run (state 0), fit the workspace
        and, with c, write D out of place: the first, or the fastest of the first
        `candidates` (_fastest)."""
        results = self.heuristic(plan)
        usable = [
            r.algo
            for r in results
            if r.state == 0 and r.workspaceSize <= self.workspace.nbytes
            and not (has_c and not self._out_of_place(r.algo))
        ][: self.candidates]  # fmt: skip
        if not usable:
            raise CublasError(
                f"cublasLtMatmulAlgoGetHeuristic failed: {_STATUS[15]} (none of {len(results)} "
                f"algorithms runs (M, N, K, trans_a, trans_b, with_c, ab_type, out_type) = {key})"
            )
        chosen = usable[0] if len(usable) == 1 else self._fastest(plan, key, usable, trial)
        ctypes.memmove(ctypes.byref(plan.algo), ctypes.byref(chosen), ctypes.sizeof(chosen))

    def heuristic(self, plan: _Plan, count: int = HEURISTIC_RESULTS) -> list[HeuristicResult]:
        """cublasLtMatmulAlgoGetHeuristic's results for plan (at most count), its best
        estimate first, each as returned (state, workspace size)."""
        results = (HeuristicResult * count)()
        found = ctypes.c_int(0)
        _check(
            self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, plan.desc, plan.a_layout, plan.b_layout, plan.cd_layout,
                plan.cd_layout, self.pref, count, results, ctypes.byref(found),
            ),
            "cublasLtMatmulAlgoGetHeuristic",
        )  # fmt: skip
        return [HeuristicResult.from_buffer_copy(r) for r in results[: found.value]]

    def _fastest(self, plan: _Plan, key: tuple, usable: list, trial) -> MatmulAlgo:
        """The algorithm of usable with the least device time (the earlier on a tie): each
        timed TIMING_ROUNDS times, in turn, into a scratch D; remembered in CHOSEN for every
        handle of the process. usable[0] where there is no timer or it cannot time now."""
        cache = (key, self.workspace.nbytes, self.candidates)
        if cache in CHOSEN:
            return MatmulAlgo.from_buffer_copy(CHOSEN[cache])
        if self.timer is None:
            return usable[0]
        M, N, out_type = key[0], key[1], key[7]
        d = self.timer.scratch((M, N), BF16 if out_type == CUDA_R_16BF else np.float32)
        best = [float("inf")] * len(usable)
        for _ in range(TIMING_ROUNDS):
            for i, algo in enumerate(usable):
                ms = self.timer.time(lambda algo=algo: trial(plan, algo, d))
                if ms is None:
                    return usable[0]
                best[i] = min(best[i], ms)
        chosen = usable[best.index(min(best))]
        CHOSEN[cache] = bytes(chosen)
        return chosen

    def _out_of_place(self, algo: MatmulAlgo) -> bool:
        val, written = ctypes.c_int32(0), ctypes.c_size_t(0)
        _check(
            self.lib.cublasLtMatmulAlgoCapGetAttribute(
                ctypes.byref(algo), CAP_OUT_OF_PLACE, ctypes.byref(val), ctypes.sizeof(val),
                ctypes.byref(written),
            ),
            "cublasLtMatmulAlgoCapGetAttribute(OUT_OF_PLACE_RESULT_SUPPORT)",
        )  # fmt: skip
        return bool(val.value)

    def _destroy(self, plan: _Plan) -> None:
        for layout in (plan.a_layout, plan.b_layout, plan.cd_layout):
            if layout:
                self.lib.cublasLtMatrixLayoutDestroy(layout)
        if plan.desc:
            self.lib.cublasLtMatmulDescDestroy(plan.desc)

    def close(self) -> None:
        """Destroy every plan's descriptors, the preference and the handle."""
        for plan in self._plans.values():
            self._destroy(plan)
        self._plans = {}
        if self.pref:
            self.lib.cublasLtMatmulPreferenceDestroy(self.pref)
            self.pref = ctypes.c_void_p()
        if self.handle:
            self.lib.cublasLtDestroy(self.handle)
            self.handle = ctypes.c_void_p()


def _types(out, a, b) -> tuple[int, int]:
    """(A's and B's data type, out's) of a product, or a ValueError naming the argument."""
    for name, x in (("a", a), ("b", b), ("out", out)):
        if np.dtype(x.dtype) not in DATA_TYPES:
            raise ValueError(f"gemm: {name} is {x.dtype}; float32 or bf16 ({BF16} bits)")
    if a.dtype != b.dtype:
        raise ValueError(f"gemm: b is {b.dtype} but a is {a.dtype}; the operands share a dtype")
    ab_type, out_type = DATA_TYPES[np.dtype(a.dtype)], DATA_TYPES[np.dtype(out.dtype)]
    if out_type == CUDA_R_16BF and ab_type != CUDA_R_16BF:
        raise ValueError("gemm: out is bf16 but a and b are float32 (cuBLASLt has no such product)")
    return ab_type, out_type


def _dims(out, a, b, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    """(M, N, K) of out (M, N) = op(a) (M, K) @ op(b) (K, N), each a C-contiguous matrix."""
    for name, x in (("out", out), ("a", a), ("b", b)):
        if len(x.shape) != 2:  # the layouts describe one matrix each
            raise ValueError(f"gemm: {name} must be 2-D, got shape {x.shape}")
        if not x.is_c_contiguous():
            raise ValueError(f"gemm: {name} must be C-contiguous")
    # plain tuples: the CUDA simulator's shapes refuse negative indices
    (ra, ca), (rb, cb) = tuple(a.shape), tuple(b.shape)
    M, K = (ca, ra) if trans_a else (ra, ca)
    Kb, N = (cb, rb) if trans_b else (rb, cb)
    if K != Kb or tuple(out.shape) != (M, N):
        raise ValueError(
            f"gemm shapes: out {out.shape} = op(a {a.shape}, T={trans_a}) "
            f"@ op(b {b.shape}, T={trans_b})"
        )
    return M, N, K


def overlaps(x, y) -> bool:
    """Whether device arrays x and y share any byte (address ranges from their interfaces)."""
    x0, y0 = _ptr(x), _ptr(y)
    return x0 < y0 + y.nbytes and y0 < x0 + x.nbytes
