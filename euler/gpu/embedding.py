"""Token embedding on the GPU: a row gather forward, an atomic scatter-add backward.

The backward adds each token's gradient row into its embedding row with atomics: the
order of additions into a row shared by repeated tokens varies, so dwte agrees with the
CPU to float32 rounding, not bit for bit.
"""

from __future__ import annotations

from numba import cuda

from euler.backend import check_shapes
from euler.gpu.memory import THREADS, fill, grid_for


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
    """dwte (V, D) += scatter of dx (N, D) by tokens (N,), with atomic adds."""
    N, D = dx.shape
    i = cuda.grid(1)
    while i < N * D:
        n = i // D
        d = i - n * D
        cuda.atomic.add(dwte, (tokens[n], d), dx[n, d])
        i += cuda.gridsize(1)


def embedding_backward(dwte, dx, tokens, accumulate, stream=0, threads: int = THREADS) -> None:
    """dwte (V, D) (+)= scatter of dx (N, D) by tokens (N,); assigned unless accumulate."""
    N, D = dx.shape
    check_shapes("embedding_backward", tokens=(tokens, (N,)), dwte=(dwte, (dwte.shape[0], D)))
    if not accumulate:
        fill(dwte, 0, stream, threads)
    embedding_backward_kernel[grid_for(N * D, threads), threads, stream](dwte, dx, tokens)
