"""Device memory helpers: allocation with a readable out-of-memory error, fills, lazy scalars.

A training step must not allocate or wait on the GPU, so results the host may want (the
loss, the gradient norm) stay in device memory as `DeviceScalar`s that are read, with one
synchronisation, only when converted to float.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from euler.errors import EulerError

THREADS = 256


def grid_for(n: int, threads: int = THREADS, cap: int = 65535) -> int:
    """Blocks for a grid-stride loop over n items (at least one, at most cap)."""
    return max(1, min(cap, (n + threads - 1) // threads))


@cuda.jit
def fill_kernel(out, value):
    """out (N,) = value, assigned."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    v = out.dtype.type(value)
    while i < out.shape[0]:
        out[i] = v
        i += stride


def fill(out, value, stream=0, threads: int = THREADS) -> None:
    """Every element of the contiguous device array `out` set to value."""
    flat = out.reshape(out.size)
    fill_kernel[grid_for(out.size, threads), threads, stream](flat, value)


def device_zeros(shape, dtype, stream=0, threads: int = THREADS):
    """A zero-filled device array; an EulerError saying needed vs free bytes if it cannot fit."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    try:
        out = cuda.device_array(shape, dtype=dtype, stream=stream)
    except Exception as e:  # numba raises CudaAPIError / driver-specific types on OOM
        if "OUT_OF_MEMORY" not in str(e) and "out of memory" not in str(e).lower():
            raise
        free, total = cuda.current_context().get_memory_info()
        raise EulerError(
            f"device memory: a buffer of shape {tuple(shape)} needs {nbytes / 2**20:.0f} MiB, "
            f"{free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB are free (other processes "
            "hold the rest: nvidia-smi lists them); a smaller batch, sequence or model needs less"
        ) from None
    if out.size:
        fill(out, 0, stream, threads)
    return out


class DeviceScalar:
    """A value still on the device (a 1-element array); float() waits for it and reads it."""

    def __init__(self, buf, stream):
        self.buf = buf
        self.stream = stream

    def __float__(self) -> float:
        host = self.buf.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return float(host[0])

    def __format__(self, spec: str) -> str:
        return format(float(self), spec)

    def __repr__(self) -> str:
        return f"DeviceScalar({float(self)!r})"
