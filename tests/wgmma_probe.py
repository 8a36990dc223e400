"""One warpgroup product (euler.gpu.wgmma) against NumPy: the descriptor and fragment layouts.

A block of 128 threads stores B (N x 8) in shared memory in the unswizzled K-major layout of
wgmma.py's docstring (core matrices lbo bytes apart along k, sbo along n), loads A (64 x 8)
into m16n8k8 A fragments, and writes D = A B^T from the accumulators as wgmma.py says they
lie. On the GPU this checks the hardware against that docstring; in the simulator, the
emulation against it. A wrong layout errs by O(1); the product of TF32-truncated operands,
exact in float64, matches to float32 rounding (1e-6 of the scale).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from euler.gpu.mma import TF32_MASK
from euler.gpu.wgmma import (
    fence_proxy_async,
    shared_desc,
    wgmma_commit,
    wgmma_fence,
    wgmma_tf32,
    wgmma_tf32_first,
    wgmma_wait,
)

N = 32  # columns of B and D: m64n32k8


@cuda.jit
def wgmma_probe_kernel(a, b, out, lbo, sbo):
    """out[0] (64, N) = a (64, 8) b (N, 8)^T, out[1] = that minus a b^T; one block of 128."""
    sm = cuda.shared.array(4096, float32)
    tid = cuda.threadIdx.x
    for idx in range(tid, N * 8, 128):
        n, k = idx // 8, idx % 8
        sm[(n // 8) * (sbo // 4) + (k // 4) * (lbo // 4) + (n % 8) * 4 + k % 4] = b[n, k]
    fence_proxy_async()
    cuda.syncthreads()
    w, g, t = tid // 32, (tid % 32) // 4, tid % 4
    r = 16 * w + g
    z = float32(0.0)
    acc = (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)
    desc = shared_desc(sm, 0, lbo, sbo)
    wgmma_fence()
    acc = wgmma_tf32_first(sm, a[r, t], a[r + 8, t], a[r, t + 4], a[r + 8, t + 4], desc, acc)
    wgmma_commit()
    d1 = wgmma_wait(acc)
    # a second product accumulating -A B^T onto it: D must come back to zero
    wgmma_fence()
    acc = wgmma_tf32(sm, -a[r, t], -a[r + 8, t], -a[r, t + 4], -a[r + 8, t + 4], desc, d1)
    wgmma_commit()
    d2 = wgmma_wait(acc)
    for j in range(16):
        row, col = r + 8 * ((j % 4) // 2), 8 * (j // 4) + 2 * t + j % 2
        out[0, row, col] = d1[j]
        out[1, row, col] = d2[j]


def truncated(x: np.ndarray) -> np.ndarray:
    """x's TF32 part (what the tensor core reads), as float64."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) & np.uint32(TF32_MASK)
    return bits.view(np.float32).astype(np.float64)


def check_wgmma_product(lbo: int = 144, sbo: int = 1152, seed: int = 0) -> None:
    """Run the probe (in the simulator or on a GPU) and assert D = A B^T, then D - A B^T = 0."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = rng.standard_normal((N, 8)).astype(np.float32)
    out = cuda.to_device(np.full((2, 64, N), np.nan, np.float32))
    wgmma_probe_kernel[1, 128](cuda.to_device(a), cuda.to_device(b), out, lbo, sbo)
    got = out.copy_to_host()
    want = truncated(a) @ truncated(b).T
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert np.abs(got[1]).max() <= 1e-5 * np.abs(want).max()
