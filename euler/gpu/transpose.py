"""Matrix transpose on the GPU: token-contiguous copies for the weight-gradient products.

A weight gradient dW (M, N) = a^T b sums over K = B T tokens, a (K, M) and b (K, N) both
token-major: cuBLAS's column-major "NT" product, in which neither operand is contiguous
along K, and Hopper's TF32 kernels want K-contiguous operands. With one operand copied to
(., K) the product runs 1.5x faster, copy included (docs/measurements.md).

A block moves one 64 x 64 tile through shared memory (rows padded to 65 floats, so a
tile column spans all banks but for pairs): 256 threads, each reading 16-byte pieces of 4
source rows and writing 16-byte pieces of 4 destination rows (vector.py), where the tile is
whole and both row lengths are multiples of 4 floats; tiles on the edges, or unaligned
arrays, go element by element: the copy runs near the memory's bandwidth, where 32 x 32
tiles of 4-byte accesses do not (bench/labs/transpose_gpu.py).

bf16 weight gradients read their operands as they are: cuBLASLt's bf16 products gain
nothing from a transposed one (GpuOptions), so only float32 is transposed (the bf16
transpose measured for that stays in bench/labs/bf16_memory_kernels_gpu.py).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu.vector import (
    aligned4,
    check_dtypes,
    load4,
    store4,
)

TILE, SIDE = 64, 16  # a block moves one TILE x TILE tile with SIDE x SIDE threads
PADDED = TILE + 1


@cuda.jit
def transpose_kernel(dst, src, R, C, vec):
    """dst (C R,) = src (R C,)^T as flat row-major arrays, one TILE x TILE tile a block;
    vec: rows of both hold whole 16-byte pieces (aligned, R and C multiples of 4)."""
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if vec and r0 + TILE <= R and c0 + TILE <= C:  # thread: columns 4 tx.. of rows ty + 16 j
        for j in range(0, TILE, SIDE):
            a0, a1, a2, a3 = load4(src, (r0 + ty + j) * C + c0 + 4 * tx)
            tile[ty + j, 4 * tx] = a0
            tile[ty + j, 4 * tx + 1] = a1
            tile[ty + j, 4 * tx + 2] = a2
            tile[ty + j, 4 * tx + 3] = a3
        cuda.syncthreads()
        for j in range(0, TILE, SIDE):  # dst row c0 + ty + j holds src column ty + j
            k = ty + j
            at = (c0 + k) * R + r0 + 4 * tx
            store4(dst, at, tile[4 * tx, k], tile[4 * tx + 1, k], tile[4 * tx + 2, k],
                   tile[4 * tx + 3, k])  # fmt: skip
        return
    for j in range(0, TILE, SIDE):  # an edge tile: each thread 16 elements, SIDE apart
        for i in range(0, TILE, SIDE):
            r, c = r0 + ty + j, c0 + tx + i
            if r < R and c < C:
                tile[ty + j, tx + i] = src[r * C + c]
    cuda.syncthreads()
    for j in range(0, TILE, SIDE):
        for i in range(0, TILE, SIDE):
            r, c = c0 + ty + j, r0 + tx + i  # dst's row is src's column
            if r < C and c < R:
                dst[r * R + c] = tile[tx + i, ty + j]


def transpose(dst, src, stream=0) -> None:
    """dst (C, R) = src (R, C)^T, both float32, C-contiguous, on stream."""
    R, C = src.shape
    check_shapes("transpose", dst=(dst, (C, R)))
    check_dtypes("transpose", np.float32, dst=dst, src=src)
    grid = ((C + TILE - 1) // TILE, (R + TILE - 1) // TILE)
    flat_dst, flat_src = dst.reshape(dst.size), src.reshape(src.size)
    vec = aligned4(dst, src) and R % 4 == 0 and C % 4 == 0
    transpose_kernel[grid, (SIDE, SIDE), stream](flat_dst, flat_src, R, C, vec)
