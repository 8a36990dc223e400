"""A stand-in for the cuBLASLt library that computes on host memory, for tests without a GPU.

FakeLt has the cublasLt* functions euler/gpu/cublaslt.py calls, and reads their arguments
as the real library would: handles and descriptors written through the pointers given,
matrices found by address through their column-major layouts (rows, cols, leading
dimension, data type), TRANSA and TRANSB applied to cuBLASLt's A and B, alpha and beta
read from host scalars, D = alpha op(A) op(B) + beta C computed in float64 from the
widened values and stored through D's address in D's type (rounded to float32, then, for
bf16, to nearest even, as an fp32 accumulator is). Only the type combinations of
cublasLtMatmul's table that the binding may use are accepted (TYPES); others are
CUBLAS_STATUS_NOT_SUPPORTED. So a wrong mapping of a row-major product (operands,
transposes, layouts, data types, C or D) gives a wrong result or an error status, as it
would on the device. Every call is logged.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np

from euler.precision import from_bf16, to_bf16

SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 7, 15
R_32F, R_16BF = 0, 14  # cudaDataType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
# (compute type, A and B type, C and D type) accepted, the scale type being CUDA_R_32F
TYPES = {
    (COMPUTE_32F, R_32F, R_32F),
    (COMPUTE_32F_FAST_TF32, R_32F, R_32F),
    (COMPUTE_32F, R_16BF, R_16BF),
    (COMPUTE_32F, R_16BF, R_32F),
}
ELEMENT = {R_32F: ctypes.c_float, R_16BF: ctypes.c_uint16}  # a matrix's elements in memory
DESC_ATTRS = {3: "TRANSA", 4: "TRANSB"}  # cublasLtMatmulDescAttributes_t
PREF_MAX_WORKSPACE_BYTES, CAP_OUT_OF_PLACE = 1, 4


class HostArray:
    """A host numpy array seen through __cuda_array_interface__, as a device array is."""

    def __init__(self, a: np.ndarray):
        self.host = a

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self.host
        return {"data": (a.ctypes.data, False), "shape": a.shape, "typestr": a.dtype.str,
                "strides": None, "version": 3}  # fmt: skip

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    nbytes = property(lambda self: self.host.nbytes)

    def is_c_contiguous(self) -> bool:
        return self.host.flags.c_contiguous


class _Fn:
    """A library function: callable, and takes the argtypes/restype a ctypes function does."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def _target(ref):
    """The ctypes object a ctypes.byref() points at."""
    return ref._obj


def _matrix(address: int, layout) -> np.ndarray:
    """The (rows, cols) column-major matrix at address as stored (float32, or uint16 bf16
    bits), as a writable view."""
    element = ELEMENT[layout.dtype]
    n, size = layout.ld * (layout.cols - 1) + layout.rows, ctypes.sizeof(element)
    flat = np.ctypeslib.as_array((element * n).from_address(address))
    strides = (size, size * layout.ld)  # column-major: down a column, then across
    return np.lib.stride_tricks.as_strided(flat, (layout.rows, layout.cols), strides)


def _read(address: int, layout) -> np.ndarray:
    """The matrix at address, widened to float64."""
    m = _matrix(address, layout)
    return (from_bf16(m) if layout.dtype == R_16BF else m).astype(np.float64)


def _write(address: int, layout, values: np.ndarray) -> None:
    """Store float64 values at address in the layout's type: float32, then bf16 (RNE)."""
    values = values.astype(np.float32)
    _matrix(address, layout)[...] = to_bf16(values) if layout.dtype == R_16BF else values


class FakeLt:
    """cuBLASLt's entry points over host memory. algos: the heuristic's results, each
    SimpleNamespace(state, workspace, out_of_place); their ids are 1, 2, ... in that order."""

    def __init__(self, algos=None):
        self.algos = algos or [SimpleNamespace(state=0, workspace=0, out_of_place=True)]
        self.objects: dict[int, SimpleNamespace] = {}  # live handles and descriptors
        self.calls: list[str] = []
        self.matmuls: list[SimpleNamespace] = []
        self.fail: dict[str, int] = {}  # function name -> status it returns instead
        self._next = 0x1000
        for name in dir(type(self)):
            if name.startswith("cublasLt"):
                setattr(self, name, _Fn(self._logged(name, getattr(self, name))))

    def _logged(self, name, fn):
        def call(*args):
            self.calls.append(name)
            return self.fail.get(name) or fn(*args)

        return call

    def heuristic_calls(self) -> int:
        return self.calls.count("cublasLtMatmulAlgoGetHeuristic")

    # --------------------------------------------------------- objects
    def _new(self, ref, kind: str, **fields) -> int:
        self._next += 16
        self.objects[self._next] = SimpleNamespace(kind=kind, **fields)
        _target(ref).value = self._next
        return SUCCESS

    def _get(self, handle, kind: str) -> SimpleNamespace:
        obj = self.objects.get(getattr(handle, "value", handle))
        assert obj is not None and obj.kind == kind, f"not a live {kind}: {handle}"
        return obj

    def _free(self, handle, kind: str) -> int:
        self._get(handle, kind)
        del self.objects[handle.value]
        return SUCCESS

    def cublasLtCreate(self, ref):
        return self._new(ref, "handle")

    def cublasLtDestroy(self, handle):
        return self._free(handle, "handle")

    def cublasLtMatmulDescCreate(self, ref, compute: int, scale_type: int):
        if scale_type != 0:  # alpha and beta are float32 (CUDA_R_32F)
            return INVALID_VALUE
        return self._new(ref, "desc", compute=compute, TRANSA=0, TRANSB=0)

    def cublasLtMatmulDescSetAttribute(self, desc, attr: int, ref, size: int):
        value = _target(ref)
        if attr not in DESC_ATTRS or size != 4 or not isinstance(value, ctypes.c_int32):
            return INVALID_VALUE
        setattr(self._get(desc, "desc"), DESC_ATTRS[attr], value.value)
        return SUCCESS

    def cublasLtMatmulDescDestroy(self, desc):
        return self._free(desc, "desc")

    def cublasLtMatrixLayoutCreate(self, ref, dtype: int, rows: int, cols: int, ld: int):
        # the binding passes whole C-contiguous arrays, so packed columns (ld = rows): a
        # wrong ld fails here rather than reading past a buffer and crashing
        if dtype not in ELEMENT or ld != rows:
            return INVALID_VALUE
        return self._new(ref, "layout", dtype=dtype, rows=rows, cols=cols, ld=ld)

    def cublasLtMatrixLayoutDestroy(self, layout):
        return self._free(layout, "layout")

    def cublasLtMatmulPreferenceCreate(self, ref):
        return self._new(ref, "pref", max_workspace=0)

    def cublasLtMatmulPreferenceSetAttribute(self, pref, attr: int, ref, size: int):
        value = _target(ref)
        if attr != PREF_MAX_WORKSPACE_BYTES or size != 8:
            return INVALID_VALUE
        self._get(pref, "pref").max_workspace = value.value
        return SUCCESS

    def cublasLtMatmulPreferenceDestroy(self, pref):
        return self._free(pref, "pref")

    # --------------------------------------------------------- products
    def _shapes(self, desc, a, b, c, d):
        """(m, n, k) of D = op(A) op(B) + C, or None where the layouts disagree."""
        if a.dtype != b.dtype or c.dtype != d.dtype:
            return None
        m, ka = (a.cols, a.rows) if desc.TRANSA else (a.rows, a.cols)
        kb, n = (b.cols, b.rows) if desc.TRANSB else (b.rows, b.cols)
        if ka != kb or (c.rows, c.cols) != (m, n) or (d.rows, d.cols) != (m, n):
            return None
        return m, n, ka

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, pref, requested,
                                       results, found_ref):  # fmt: skip
        self._get(handle, "handle")
        desc, pref = self._get(desc, "desc"), self._get(pref, "pref")
        layouts = [self._get(x, "layout") for x in (a, b, c, d)]
        if self._shapes(desc, *layouts) is None:
            return INVALID_VALUE
        if (desc.compute, layouts[0].dtype, layouts[3].dtype) not in TYPES:
            return NOT_SUPPORTED
        n = 0
        for i, algo in enumerate(self.algos[:requested]):
            if algo.workspace > pref.max_workspace:
                continue  # the real heuristic honours the preference as well
            r = results[n]
            r.algo.data[0], r.workspaceSize, r.state = i + 1, algo.workspace, algo.state
            n += 1
        _target(found_ref).value = n
        return SUCCESS if n else NOT_SUPPORTED

    def cublasLtMatmulAlgoCapGetAttribute(self, algo_ref, attr: int, ref, size: int, written):
        if attr != CAP_OUT_OF_PLACE or size != 4:
            return INVALID_VALUE
        _target(ref).value = int(self.algos[_target(algo_ref).data[0] - 1].out_of_place)
        _target(written).value = 4
        return SUCCESS

    def cublasLtMatmul(self, handle, desc, alpha_ref, a_ptr, a, b_ptr, b, beta_ref, c_ptr, c,
                       d_ptr, d, algo_ref, workspace, workspace_bytes, stream):  # fmt: skip
        self._get(handle, "handle")
        desc = self._get(desc, "desc")
        a, b, c, d = (self._get(x, "layout") for x in (a, b, c, d))
        if self._shapes(desc, a, b, c, d) is None:
            return INVALID_VALUE
        if (desc.compute, a.dtype, d.dtype) not in TYPES:
            return NOT_SUPPORTED
        alpha, beta = _target(alpha_ref).value, _target(beta_ref).value
        algo = _target(algo_ref).data[0]
        if c_ptr != d_ptr and not self.algos[algo - 1].out_of_place:
            return NOT_SUPPORTED
        A, B = _read(a_ptr, a), _read(b_ptr, b)
        A = A.T if desc.TRANSA else A
        B = B.T if desc.TRANSB else B
        result = alpha * (A @ B)
        if beta != 0:  # beta = 0: C is not read
            result += beta * _read(c_ptr, c)
        _write(d_ptr, d, result)
        self.matmuls.append(SimpleNamespace(
            compute=desc.compute, alpha=alpha, beta=beta, c=c_ptr, d=d_ptr, algo=algo,
            workspace=workspace, workspace_bytes=workspace_bytes,
            stream=getattr(stream, "value", stream),
            types=(a.dtype, b.dtype, c.dtype, d.dtype),
        ))  # fmt: skip
        return SUCCESS
