"""Matrix transpose on the GPU: token-contiguous copies for the weight-gradient products.

A weight gradient dW (M, N) = a^T b sums over K = B T tokens, a (K, M) and b (K, N) both
token-major: cuBLAS's column-major "NT" product, in which neither operand is contiguous
along K, and Hopper's TF32 kernels want K-contiguous operands. With one operand copied to
(., K) they ran 1.5x faster on an H200 (bench/gemm_lab_gpu.py: 0.349 against 0.544 ms at
M, N, K = 4096, 768, 16384), and the copy of a 768-wide operand took 0.084 ms.
"""

from __future__ import annotations

from numba import cuda, float32

TILE, ROWS = 32, 8  # a block moves one TILE x TILE tile with TILE x ROWS threads
PADDED = TILE + 1  # tile rows padded: a column of the tile then spans all 32 banks


@cuda.jit
def transpose_kernel(dst, src):
    """dst (C, R) = src (R, C)^T, one 32 x 32 tile per block through shared memory: both
    the reads and the writes are whole 128-byte rows."""
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    R, C = src.shape
    for j in range(0, TILE, ROWS):
        r, c = r0 + ty + j, c0 + tx
        if r < R and c < C:
            tile[ty + j, tx] = src[r, c]
    cuda.syncthreads()
    for j in range(0, TILE, ROWS):
        r, c = c0 + ty + j, r0 + tx  # dst's row is src's column
        if r < C and c < R:
            dst[r, c] = tile[tx, ty + j]


def transpose(dst, src, stream=0) -> None:
    """dst (C, R) = src (R, C)^T, float32, on stream."""
    R, C = src.shape
    assert dst.shape == (C, R), (dst.shape, src.shape)
    grid = ((C + TILE - 1) // TILE, (R + TILE - 1) // TILE)
    transpose_kernel[grid, (TILE, ROWS), stream](dst, src)
