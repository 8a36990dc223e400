"""A thin ctypes binding of NCCL: all-reduce (average) and broadcast on numba's stream.

The library is found like cuBLAS (euler/gpu/cublas.py): NVIDIA's pip wheel through
`cuda.pathfinder`, then `CUDA_HOME`, then the system loader; a missing NCCL is one
EulerError. A communicator needs every rank to hold the same 128-byte id, made by rank 0
(ncclGetUniqueId, which needs no GPU) and handed to the others through MPI (NcclComm) or
through a file that every rank can read (file_rendezvous). Every call checks its status
and raises with NCCL's own message.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from pathlib import Path

import numpy as np

from euler.errors import EulerError
from euler.gpu.libs import library_candidates

INSTALL_HINT = "install NVIDIA's NCCL wheel: pip install nvidia-nccl-cu13"
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES in nccl.h
# ncclDataType_t and ncclRedOp_t values from nccl.h (checked against the wheel's header)
DTYPES = {np.dtype(np.float32): 7, np.dtype(np.float64): 8}
NCCL_AVG = 4  # ncclAvg: sum / nranks, in one pass


class NcclError(RuntimeError):
    """An NCCL call returned a status other than ncclSuccess."""


class UniqueId(ctypes.Structure):
    """ncclUniqueId: opaque bytes, passed by value to ncclCommInitRank."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


def _candidates() -> list[str]:
    return library_candidates("nccl", "libnccl.so.2")


def load_library() -> ctypes.CDLL:
    """The first NCCL that loads, with its signatures declared, or a one-line EulerError."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    else:
        raise EulerError(
            f"NCCL not found (tried the nvidia-nccl wheel, CUDA_HOME, the system); {INSTALL_HINT}"
        )
    vp, i32, size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [i32]
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.ncclGetLastError.argtypes = [vp]
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(i32)]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i32, UniqueId, i32]
    lib.ncclCommDestroy.argtypes = [vp]
    # sendbuff, recvbuff, count, datatype, op, comm, stream
    lib.ncclAllReduce.argtypes = [vp, vp, size_t, i32, i32, vp, vp]
    # sendbuff, recvbuff, count, datatype, root, comm, stream
    lib.ncclBroadcast.argtypes = [vp, vp, size_t, i32, i32, vp, vp]
    return lib


def _check(lib: ctypes.CDLL, status: int, what: str, comm=None) -> None:
    if status != 0:
        detail = lib.ncclGetLastError(comm) or b""
        raise NcclError(
            f"{what} failed: {lib.ncclGetErrorString(status).decode()} {detail.decode()}".strip()
        )


def version(lib: ctypes.CDLL) -> int:
    """NCCL's version code, e.g. 23203 for 2.32.3 (needs no GPU)."""
    v = ctypes.c_int()
    _check(lib, lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value


def unique_id(lib: ctypes.CDLL) -> bytes:
    """A fresh communicator id (rank 0 makes it; needs no GPU)."""
    uid = UniqueId()
    _check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)


def file_rendezvous(path: str | Path, rank: int, make_id, timeout: float = 60.0) -> bytes:
    """Hand rank 0's id to every rank through a file (no MPI needed): rank 0 writes it
    atomically (write, then rename), the others poll until it appears.

    make_id () -> bytes is called on rank 0 only. The file should be fresh for each run.
    """
    path = Path(path)
    if rank == 0:
        uid = make_id()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(uid)
        tmp.replace(path)
        return uid
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise EulerError(f"NCCL rendezvous: rank 0 wrote no id to {path} in {timeout:.0f} s")
        time.sleep(0.01)
    return path.read_bytes()


def _ptr(a) -> int:
    """Device address of a numba device array (a view's offset included)."""
    return a.__cuda_array_interface__["data"][0]


class Nccl:
    """One NCCL communicator (this rank of `size`) whose collectives run on one CUDA stream."""

    def __init__(self, lib: ctypes.CDLL, uid: bytes, rank: int, size: int, stream_handle: int):
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"NCCL id: {len(uid)} bytes, need {UNIQUE_ID_BYTES}")
        self.lib, self.rank, self.size = lib, rank, size
        self.stream = ctypes.c_void_p(stream_handle)
        self.comm = ctypes.c_void_p()
        uid_struct = UniqueId.from_buffer_copy(uid)
        _check(lib, lib.ncclCommInitRank(ctypes.byref(self.comm), size, uid_struct, rank),
               "ncclCommInitRank")  # fmt: skip

    @staticmethod
    def _dtype(buf) -> int:
        if buf.dtype not in DTYPES or not buf.is_c_contiguous():
            raise ValueError(f"NCCL: need a contiguous float32/64 device array, got {buf.dtype}")
        return DTYPES[buf.dtype]

    def allreduce_mean(self, buf) -> None:
        """buf (n,) = the mean over ranks of buf, in place, queued on the stream."""
        status = self.lib.ncclAllReduce(
            _ptr(buf), _ptr(buf), buf.size, self._dtype(buf), NCCL_AVG, self.comm, self.stream
        )
        self._check(status, "ncclAllReduce")

    def broadcast(self, buf) -> None:
        """buf (n,) = rank 0's buf, in place, queued on the stream."""
        status = self.lib.ncclBroadcast(
            _ptr(buf), _ptr(buf), buf.size, self._dtype(buf), 0, self.comm, self.stream
        )
        self._check(status, "ncclBroadcast")

    def _check(self, status: int, what: str) -> None:
        _check(self.lib, status, what, self.comm)

    def close(self) -> None:
        if self.comm:
            self.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()


class NcclComm:
    """GPU ranks under mpiexec: NCCL for device arrays, MPI for host arrays and the id.

    Made before the backend (it selects this rank's GPU: its index among the ranks on the
    node); bind(backend) then creates the communicator on the backend's stream.
    """

    def __init__(self, mpi):
        self.lib = load_library()  # a missing NCCL fails before any GPU work
        from numba import cuda

        self.mpi, self.rank, self.size = mpi, mpi.rank, mpi.size
        n_gpus = len(cuda.gpus)
        local = mpi.local_rank()
        if local >= n_gpus:
            raise EulerError(
                f"rank {self.rank} is rank {local} on its node, which has only {n_gpus} GPUs"
            )
        cuda.select_device(local)
        self.nccl: Nccl | None = None

    def bind(self, backend) -> None:
        uid = np.frombuffer(unique_id(self.lib) if self.rank == 0 else bytes(UNIQUE_ID_BYTES),
                            dtype=np.uint8).copy()  # fmt: skip
        self.mpi.broadcast(uid)
        handle = backend.stream.handle
        self.nccl = Nccl(self.lib, uid.tobytes(), self.rank, self.size,
                         int(getattr(handle, "value", handle)))  # fmt: skip

    def allreduce_mean(self, buf) -> None:
        if isinstance(buf, np.ndarray):
            self.mpi.allreduce_mean(buf)
        else:
            self.nccl.allreduce_mean(buf)

    def broadcast(self, buf) -> None:
        if isinstance(buf, np.ndarray):
            self.mpi.broadcast(buf)
        else:
            self.nccl.broadcast(buf)

    def barrier(self) -> None:
        self.mpi.barrier()
