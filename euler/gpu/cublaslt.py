"""A thin ctypes binding of cuBLASLt: row-major float32 GEMMs whose C input is not D.

Legacy cuBLAS (cublas.py) computes C = alpha op(A) op(B) + beta C: the matrix added is the
one written. cublasLtMatmul reads C and writes D through separate pointers, so
out = res + a @ w^T, a residual add after an output projection, is one call that leaves res
as it was: no product into a temporary, no add kernel reading it back
(bench/labs/cublaslt_lab_gpu.py measured it on an H200; GpuBackend.matmul_residual uses it).

The row-major to column-major mapping is cublas.py's: row-major out (M, N) = op(a) @ op(b)
is the column-major out^T = op(b)^T op(a)^T, so cuBLASLt's A is our b, its B our a, m = N,
n = M; a row-major (r, c) array is the column-major (c, r) one with leading dimension c.

Each distinct product (shape, transposes, with or without C) gets its descriptor, layouts
and the heuristic's first usable algorithm once, on its first call; later calls reuse them.
So a call captured into a CUDA graph queries nothing (the trainer runs a step eagerly
before capturing it: euler/training/step_graph.py), and the workspace is the caller's device buffer,
so cuBLASLt allocates nothing either.
"""

from __future__ import annotations

import ctypes

from euler.gpu.cublas import _STATUS, Cublas, CublasError, _ptr
from euler.gpu.libs import library_candidates

# ---------------------------------------------------------------- header values (ABI)
# cublas_api.h: cublasOperation_t CUBLAS_OP_N = 0, CUBLAS_OP_T = 1; cublasComputeType_t
# CUBLAS_COMPUTE_32F = 68 (exact fp32), CUBLAS_COMPUTE_32F_FAST_TF32 = 77 (fp32 in and out,
# TF32 tensor cores, fp32 accumulate).
OP_N, OP_T = 0, 1
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
# library_types.h: cudaDataType_t CUDA_R_32F = 0 (the matrices' type and alpha/beta's).
CUDA_R_32F = 0
# cublasLt.h: cublasLtMatmulDescAttributes_t CUBLASLT_MATMUL_DESC_TRANSA = 3, _TRANSB = 4
# (int32_t holding a cublasOperation_t).
DESC_TRANSA, DESC_TRANSB = 3, 4
# cublasLtMatmulPreferenceAttributes_t CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 (uint64_t).
PREF_MAX_WORKSPACE_BYTES = 1
# cublasLtMatmulAlgoCapAttributes_t CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT = 4
# (int32_t): whether an algorithm may write D elsewhere than C. The heuristic sees layouts,
# not pointers, so it cannot know that C != D is wanted: a call with c asks each candidate.
CAP_OUT_OF_PLACE = 4
HEURISTIC_RESULTS = 8  # candidates asked for; the first usable one is kept

LIB_NAME, LIB_SONAME = "cublasLt", "libcublasLt.so"


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


# the sizes the header implies (and the H200 lab read back): a mismatch would corrupt memory
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
    """One product's matmul descriptor, its three layouts and the algorithm chosen."""

    def __init__(self):
        self.desc = ctypes.c_void_p()
        self.a_layout = ctypes.c_void_p()  # cuBLASLt's A: our b
        self.b_layout = ctypes.c_void_p()  # cuBLASLt's B: our a
        self.cd_layout = ctypes.c_void_p()  # C and D: out^T, N x M column-major
        self.algo = MatmulAlgo()


class CublasLt:
    """One cuBLASLt handle issuing on one CUDA stream with the caller's workspace.

    stream_handle: the CUstream (an int) every product is enqueued on. workspace: a device
    buffer (uint8; the backend gives 32 MiB) kept referenced here and used by every call.
    tf32: CUBLAS_COMPUTE_32F_FAST_TF32, else exact fp32 (CUBLAS_COMPUTE_32F).
    """

    def __init__(self, stream_handle: int, workspace, tf32: bool = True):
        for struct, size in STRUCT_SIZES.items():
            if ctypes.sizeof(struct) != size:
                raise CublasError(f"{struct.__name__}: {ctypes.sizeof(struct)} bytes, not {size}")
        self.handle, self.pref = ctypes.c_void_p(), ctypes.c_void_p()
        self._plans: dict[tuple, _Plan] = {}
        self.lib = load_library()
        _declare(self.lib)
        self.stream = ctypes.c_void_p(stream_handle)
        self.workspace, self.tf32 = workspace, tf32
        self.compute = COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F
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

    def gemm(self, out, a, b, trans_a=False, trans_b=False, c=None) -> None:
        """out (M, N) = op(a) (M, K) @ op(b) (K, N), plus c (M, N) when given; row-major
        float32, C-contiguous. c is only read and may not overlap out (C != D is the point:
        for out += ... use Cublas.gemm(accumulate=True))."""
        for name, x in (("out", out), ("a", a), ("b", b)):
            if len(x.shape) != 2:  # the layouts describe one matrix each
                raise ValueError(f"gemm: {name} must be 2-D, got shape {x.shape}")
        M, N, K = Cublas._dims(out, a, b, trans_a, trans_b)
        if c is not None:
            if c.shape != out.shape or c.dtype != out.dtype or not c.is_c_contiguous():
                raise ValueError(f"gemm: c {c.shape} {c.dtype} must match out {out.shape}")
            if overlaps(c, out):
                raise ValueError("gemm: c may not overlap out")
        plan = self._plan(M, N, K, trans_a, trans_b, c is not None)
        _check(
            self.lib.cublasLtMatmul(
                self.handle, plan.desc, ctypes.byref(self._one),
                _ptr(b), plan.a_layout, _ptr(a), plan.b_layout,
                ctypes.byref(self._zero if c is None else self._one),
                _ptr(out if c is None else c), plan.cd_layout, _ptr(out), plan.cd_layout,
                ctypes.byref(plan.algo), _ptr(self.workspace), self.workspace.nbytes, self.stream,
            ),
            "cublasLtMatmul",
        )  # fmt: skip

    def _plan(self, M: int, N: int, K: int, trans_a: bool, trans_b: bool, has_c: bool) -> _Plan:
        """The cached plan of this product, made (and its algorithm chosen) on first use."""
        key = (M, N, K, trans_a, trans_b, has_c)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        plan = _Plan()
        try:
            self._describe(plan, M, N, K, trans_a, trans_b)
            self._choose(plan, key)
        except BaseException:
            self._destroy(plan)
            raise
        self._plans[key] = plan
        return plan

    def _describe(self, plan: _Plan, M: int, N: int, K: int, trans_a: bool, trans_b: bool):
        lib = self.lib
        _check(
            lib.cublasLtMatmulDescCreate(ctypes.byref(plan.desc), self.compute, CUDA_R_32F),
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
        for layout, rows, cols in (
            (plan.a_layout, b_cols, b_rows),
            (plan.b_layout, a_cols, a_rows),
            (plan.cd_layout, N, M),
        ):
            _check(
                lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), CUDA_R_32F, rows, cols, rows),
                "cublasLtMatrixLayoutCreate",
            )

    def _choose(self, plan: _Plan, key: tuple) -> None:
        """plan.algo = the heuristic's first result that can run (state 0), fits the
        workspace and, with c, writes D out of place."""
        results = (HeuristicResult * HEURISTIC_RESULTS)()
        found = ctypes.c_int(0)
        _check(
            self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, plan.desc, plan.a_layout, plan.b_layout, plan.cd_layout,
                plan.cd_layout, self.pref, HEURISTIC_RESULTS, results, ctypes.byref(found),
            ),
            "cublasLtMatmulAlgoGetHeuristic",
        )  # fmt: skip
        for r in results[: found.value]:
            if r.state != 0 or r.workspaceSize > self.workspace.nbytes:
                continue
            if key[-1] and not self._out_of_place(r.algo):
                continue
            ctypes.memmove(ctypes.byref(plan.algo), ctypes.byref(r.algo), ctypes.sizeof(r.algo))
            return
        raise CublasError(
            f"cublasLtMatmulAlgoGetHeuristic failed: {_STATUS[15]} (none of {found.value} "
            f"algorithms runs (M, N, K, trans_a, trans_b, with_c) = {key})"
        )

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


def overlaps(x, y) -> bool:
    """Whether device arrays x and y share any byte (address ranges from their interfaces)."""
    x0, y0 = _ptr(x), _ptr(y)
    return x0 < y0 + y.nbytes and y0 < x0 + x.nbytes
