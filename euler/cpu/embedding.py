"""Token embedding on the CPU: a row gather forward, a race-free scatter-add backward."""

from __future__ import annotations

from numba import njit, prange

from euler.cpu.chunks import CHUNKS


@njit(parallel=True, cache=True, error_model="numpy")
def embedding_forward(x, tokens, wte):
    """x (N, D) = wte (V, D)[tokens (N,)], assigned. Token ids are checked by the caller."""
    N, D = x.shape
    for n in prange(N):
        t = tokens[n]
        for d in range(D):
            x[n, d] = wte[t, d]


@njit(parallel=True, cache=True, error_model="numpy")
def embedding_backward(dwte, dx, tokens, accumulate):
    """dwte (V, D) (+)= scatter of dx (N, D) by tokens (N,); assigned unless accumulate.

    Threads split the D columns, not the tokens: two tokens with the same id would
    otherwise add into the same row from two threads.
    """
    V, D = dwte.shape
    N = dx.shape[0]
    T = dwte.dtype.type
    nchunk = min(CHUNKS, D)
    for c in prange(nchunk):
        d0 = c * D // nchunk
        d1 = (c + 1) * D // nchunk
        if not accumulate:
            for v in range(V):
                for d in range(d0, d1):
                    dwte[v, d] = T(0.0)
        for n in range(N):
            t = tokens[n]
            for d in range(d0, d1):
                dwte[t, d] += dx[n, d]
