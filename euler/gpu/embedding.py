"""Token embedding on the GPU: a row gather forward, an atomic scatter-add backward.

    kernel                              runs where
    embedding_forward_kernel            the forward (wte and x float32)
    embedding_backward_vec_bf16_kernel  bf16 dx, D % 8 == 0, 16-byte aligned (every preset)
    embedding_backward_kernel           float32 dx, or bf16 anywhere else: the generic one

The backward adds each token's gradient row into its embedding row with atomics: the
order of additions into a row shared by repeated tokens varies, so dwte agrees with the
CPU to float32 rounding, not bit for bit.

Under bf16 (euler.precision) the backward reads a bf16 dx (uint16 bits; the residual
stream's gradient) into the float32 dwte: where D % 8 == 0 and the buffers are 16-byte
aligned (the presets), a thread widens 8 columns of one 16-byte load and adds them with two
red.global.add.v4.f32 (vector.py), one atomic request for 4 elements where float32 makes
one an element.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from euler.backend import check_shapes
from euler.gpu.bf16 import widen
from euler.gpu.memory import THREADS, fill, grid_for
from euler.gpu.vector import aligned4, aligned8_bf16, atomic_add4_flat, check_dtypes, load8_bf16
from euler.precision import is_bf16


@cuda.jit
def embedding_forward_kernel(x, tokens, wte):
    """x (N, D) = wte (V, D)[tokens (N,)], assigned; one thread per element, grid-stride."""
    N, D = x.shape
    i = cuda.grid(1)
    while i < N * D:
        n = i // D
        d = i - n * D
        x[n, d] = wte[tokens[n], d]
        i += cuda.gridsize(1)


def embedding_forward(x, tokens, wte, stream=0, threads: int = THREADS) -> None:
    """x (N, D) = wte (V, D)[tokens (N,)], assigned. Token ids are checked by the caller."""
    N, D = x.shape
    check_shapes("embedding_forward", tokens=(tokens, (N,)), wte=(wte, (wte.shape[0], D)))
    embedding_forward_kernel[grid_for(N * D, threads), threads, stream](x, tokens, wte)


@cuda.jit
def embedding_backward_kernel(dwte, dx, tokens):
    """dwte (V, D) += scatter of dx (N, D) (float32 or bf16) by tokens (N,), with atomic adds."""
    N, D = dx.shape
    i = cuda.grid(1)
    while i < N * D:
        n = i // D
        d = i - n * D
        cuda.atomic.add(dwte, (tokens[n], d), widen(dx[n, d]))
        i += cuda.gridsize(1)


@cuda.jit
def embedding_backward_vec_bf16_kernel(dwte, dx, tokens, D):
    """embedding_backward_kernel on bf16 flat dx (N D,) and dwte as (1, V, D): a thread per 8
    columns (one 16-byte load, two 4-element atomic adds; D % 8 == 0), grid-stride."""
    i = 8 * cuda.grid(1)
    while i < dx.shape[0]:
        n = i // D
        at = tokens[n] * D + i - n * D
        v0, v1, v2, v3, v4, v5, v6, v7 = load8_bf16(dx, i)
        atomic_add4_flat(dwte, at, v0, v1, v2, v3)
        atomic_add4_flat(dwte, at + 4, v4, v5, v6, v7)
        i += 8 * cuda.gridsize(1)


def embedding_backward(dwte, dx, tokens, accumulate, stream=0, threads: int = THREADS) -> None:
    """dwte (V, D) (+)= scatter of dx (N, D) by tokens (N,); assigned unless accumulate.

    dwte float32; dx float32 or bf16."""
    N, D = dx.shape
    check_shapes("embedding_backward", tokens=(tokens, (N,)), dwte=(dwte, (dwte.shape[0], D)))
    bf16 = is_bf16(dx)
    if bf16:
        check_dtypes("embedding_backward", np.float32, dwte=dwte)
    if not accumulate:
        fill(dwte, 0, stream, threads)
    if bf16 and D % 8 == 0 and aligned8_bf16(dx) and aligned4(dwte):
        grid = grid_for(N * D // 8, threads)
        wide = dwte.reshape(1, *dwte.shape)  # atomic_add4_flat's 3-d float32 array
        embedding_backward_vec_bf16_kernel[grid, threads, stream](wide, dx.reshape(dx.size),
                                                                  tokens, D)  # fmt: skip
    else:
        embedding_backward_kernel[grid_for(N * D, threads), threads, stream](dwte, dx, tokens)
