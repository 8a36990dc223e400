"""A thin ctypes binding of cuBLAS: one handle on numba's stream, row-major GEMMs.

The library is found through NVIDIA's pip wheel (`cuda.pathfinder`), then `CUDA_HOME`,
then the system loader. cuBLAS is column-major; a row-major (M, N) matrix is the same
memory as its column-major transpose, so row-major C = op(A) op(B) is computed as the
column-major C^T = op(B)^T op(A)^T with the operands swapped. Every call checks its status
and raises with the status name.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from euler.errors import EulerError
from euler.gpu.libs import library_candidates

INSTALL_HINT = "install the GPU extra: pip install 'nanoeuler[gpu]'"

_STATUS = {
    0: "CUBLAS_STATUS_SUCCESS",
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}
_OP_N, _OP_T = 0, 1
_DEFAULT_MATH = 0  # exact fp32 FMA
_TF32_TENSOR_OP_MATH = 3  # fp32 in, TF32 tensor cores, fp32 accumulate


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than success."""


def _candidates() -> list[str]:
    return library_candidates("cublas", "libcublas.so")


def load_library() -> ctypes.CDLL:
    """The first cuBLAS that loads, or an EulerError naming what was tried."""
    tried = _candidates()
    for path in tried:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise EulerError(
        f"cuBLAS not found (tried the nvidia-cublas wheel, CUDA_HOME, the system); {INSTALL_HINT}"
    )


def _ptr(a) -> int:
    """Device address of a numba device array (a view's offset included)."""
    return a.__cuda_array_interface__["data"][0]


class Cublas:
    """One cuBLAS handle bound to one CUDA stream; TF32 tensor cores unless `tf32=False`;
    workspace: a device buffer to use as cuBLAS's (set_workspace)."""

    def __init__(self, stream_handle: int, tf32: bool = True, workspace=None):
        self.lib = load_library()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self._check(
            self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_handle)),
            "cublasSetStream_v2",
        )
        self.set_tf32(tf32)
        self._one = ctypes.c_float(1.0)
        self._zero = ctypes.c_float(0.0)
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        # handle, op_a, op_b, m, n, k, alpha*, A, lda, B, ldb, beta*, C, ldc
        gemm = [vp, i32, i32, i32, i32, i32, vp, vp, i32, vp, i32, vp, vp, i32]
        self.lib.cublasSgemm_v2.argtypes = gemm
        # the same with a stride after each leading dimension, then the batch count
        batched = gemm[:9] + [i64] + gemm[9:11] + [i64] + gemm[11:] + [i64, i32]
        self.lib.cublasSgemmStridedBatched.argtypes = batched
        if workspace is not None:
            self.set_workspace(workspace)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed: {_STATUS.get(status, f'status {status}')}")

    def set_tf32(self, on: bool) -> None:
        """TF32 tensor-core math (about 1e-3 relative) or exact fp32 (for the checks)."""
        mode = _TF32_TENSOR_OP_MATH if on else _DEFAULT_MATH
        self._check(self.lib.cublasSetMathMode(self.handle, mode), "cublasSetMathMode")
        self.tf32 = on

    def set_workspace(self, buf) -> None:
        """Use the device buffer buf (uint8, >= 4 MiB) as cuBLAS's workspace.

        Without one cuBLAS allocates its own, which stream capture (CUDA graphs) cannot
        record.
        """
        self.lib.cublasSetWorkspace_v2.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
        ]  # fmt: skip
        self._check(
            self.lib.cublasSetWorkspace_v2(self.handle, _ptr(buf), buf.nbytes),
            "cublasSetWorkspace_v2",
        )
        self.workspace = buf  # cuBLAS holds only its address: the buffer lives as the handle does

    @staticmethod
    def _dims(out, a, b, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
        """(M, N, K) of out (M, N) = op(a) (M, K) @ op(b) (K, N), checked; all row-major."""
        # plain tuples: the CUDA simulator's shapes refuse negative indices
        sa, sb, so = tuple(a.shape), tuple(b.shape), tuple(out.shape)
        M, K = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
        Kb, N = (sb[-1], sb[-2]) if trans_b else (sb[-2], sb[-1])
        if K != Kb or so[-2:] != (M, N):
            raise ValueError(
                f"gemm shapes: out {out.shape} = op(a {a.shape}, T={trans_a}) "
                f"@ op(b {b.shape}, T={trans_b})"
            )
        for name, x in (("out", out), ("a", a), ("b", b)):
            if not x.is_c_contiguous():
                raise ValueError(f"gemm: {name} must be C-contiguous")
            if x.dtype.itemsize != 4 or x.dtype.kind != "f":
                raise EulerError(f"GPU engine: computes in float32, got {name} in {x.dtype}")
        return M, N, K

    def gemm(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=); row-major float32."""
        M, N, K = self._dims(out, a, b, trans_a, trans_b)
        beta = self._one if accumulate else self._zero
        self._check(
            self.lib.cublasSgemm_v2(
                self.handle,
                _OP_T if trans_b else _OP_N,
                _OP_T if trans_a else _OP_N,
                N, M, K,
                ctypes.byref(self._one),
                _ptr(b), b.shape[-1],
                _ptr(a), a.shape[-1],
                ctypes.byref(beta),
                _ptr(out), N,
            ),
            "cublasSgemm_v2",
        )  # fmt: skip

    def gemm_strided_batched(
        self, out, a, b, trans_a=False, trans_b=False, accumulate=False
    ) -> None:
        """out (Z, M, N) = op(a[z]) @ op(b[z]) for each z; a, b (Z, ., .), row-major float32."""
        M, N, K = self._dims(out, a, b, trans_a, trans_b)
        Z = out.shape[0]
        if a.shape[0] != Z or b.shape[0] != Z or out.ndim != 3:
            raise ValueError(f"batched gemm: batch sizes {out.shape}, {a.shape}, {b.shape}")
        beta = self._one if accumulate else self._zero
        self._check(
            self.lib.cublasSgemmStridedBatched(
                self.handle,
                _OP_T if trans_b else _OP_N,
                _OP_T if trans_a else _OP_N,
                N, M, K,
                ctypes.byref(self._one),
                _ptr(b), b.shape[-1], b.shape[-2] * b.shape[-1],
                _ptr(a), a.shape[-1], a.shape[-2] * a.shape[-1],
                ctypes.byref(beta),
                _ptr(out), N, M * N,
                Z,
            ),
            "cublasSgemmStridedBatched",
        )  # fmt: skip

    def close(self) -> None:
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()
