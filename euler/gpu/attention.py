"""Causal grouped-query FlashAttention on the GPU, exact fp32.

Forward: a block takes BQ query rows of one (batch, head), one thread per row; keys and
values stream through shared memory in tiles of BK; each thread keeps its query and output
accumulator in registers and runs the online softmax (one max and one rescale per tile),
then saves the row's logsumexp. Backward, in two kernels that own every slot they write
(no atomics): dQ by query rows (also saving D_i = rowsum(dO * O)), then dK, dV by key rows
of one kv head, visiting the query rows of every query head in its group tile by tile.
Probabilities are recomputed from the logsumexp; no T x T matrix is ever stored.

qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query head h reads kv
head h // (H / G). Kernels are built per (E, tile sizes): E must be a compile-time
constant for the per-thread register arrays.

These one-row-per-thread kernels serve any even head size; for E a multiple of 8 up to
64 the launchers use the register-tiled kernels of attention_tiles.py instead (same
results to rounding, several times faster), unless a tile size is forced (tests do).
"""

from __future__ import annotations

import math

import numba
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu import attention_tiles
from euler.gpu.async_copy import check_aligned
from euler.gpu.reduce import MAX_THREADS, SIMULATOR, group_sum
from euler.gpu.vector import load4_3d, store4_3d
from euler.layer_math import online_softmax_rescale

_KERNELS: dict = {}
_SHARED_RAISED: set = set()  # (kernel, signature) whose dynamic shared limit is raised


def tile_for(E: int) -> int:
    """Rows per tile: 64 while two (tile, E) float32 tiles fit in 48 KB of shared memory."""
    t = 64
    while t > 8 and 2 * t * E * 4 > 40 * 1024:
        t //= 2
    return t


def _build(E: int, BQ: int, BK: int):
    """The three kernels for head size E, BQ query rows and BK key rows per tile."""

    @cuda.jit
    def forward_kernel(out, lse, qkv, H, G, scale):
        """out (B, T, H E), lse (B, H, T) from qkv; grid (T / BQ, B H), BQ threads."""
        B, Tn, _ = qkv.shape
        T = qkv.dtype.type
        ks = cuda.shared.array((BK, E), float32)
        vs = cuda.shared.array((BK, E), float32)
        q = cuda.local.array(E, float32)
        acc = cuda.local.array(E, float32)
        s = cuda.local.array(BK, float32)
        rep = H // G
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        qo = h * E
        ko = H * E + (h // rep) * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        i0 = cuda.blockIdx.x * BQ
        i = i0 + tid
        if i < Tn:
            for e in range(E):
                q[e] = qkv[b, i, qo + e] * scale
                acc[e] = T(0.0)
        m = T(-math.inf)
        l = T(0.0)
        for j0 in range(0, min(i0 + BQ, Tn), BK):
            for idx in range(tid, BK * E, BQ):
                jj = idx // E
                e = idx - jj * E
                if j0 + jj < Tn:
                    ks[jj, e] = qkv[b, j0 + jj, ko + e]
                    vs[jj, e] = qkv[b, j0 + jj, vo + e]
            cuda.syncthreads()
            if i < Tn and j0 <= i:
                n = min(BK, i + 1 - j0)
                mt = T(-math.inf)
                for jj in range(n):
                    dot = T(0.0)
                    for e in range(E):
                        dot += q[e] * ks[jj, e]
                    s[jj] = dot
                    mt = max(mt, dot)
                m_new = max(m, mt)
                alpha = online_softmax_rescale(m, m_new, T)
                l *= alpha
                for e in range(E):
                    acc[e] *= alpha
                for jj in range(n):
                    p = math.exp(s[jj] - m_new)
                    l += p
                    for e in range(E):
                        acc[e] += p * vs[jj, e]
                m = m_new
            cuda.syncthreads()
        if i < Tn:
            inv = T(1.0) / l
            for e in range(E):
                out[b, i, qo + e] = acc[e] * inv
            lse[b, h, i] = m + math.log(l)

    @cuda.jit
    def backward_dq_kernel(dqkv, dsum, dout, qkv, out, lse, H, G, scale):
        """dQ part of dqkv and dsum (B, H, T) = rowsum(dO * O); grid (T / BQ, B H), BQ threads."""
        B, Tn, _ = qkv.shape
        T = qkv.dtype.type
        ks = cuda.shared.array((BK, E), float32)
        vs = cuda.shared.array((BK, E), float32)
        q = cuda.local.array(E, float32)
        do = cuda.local.array(E, float32)
        dq = cuda.local.array(E, float32)
        rep = H // G
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        qo = h * E
        ko = H * E + (h // rep) * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        i0 = cuda.blockIdx.x * BQ
        i = i0 + tid
        di = T(0.0)
        li = T(0.0)
        if i < Tn:
            for e in range(E):
                q[e] = qkv[b, i, qo + e]
                do[e] = dout[b, i, qo + e]
                di += do[e] * out[b, i, qo + e]
                dq[e] = T(0.0)
            li = lse[b, h, i]
            dsum[b, h, i] = di
        for j0 in range(0, min(i0 + BQ, Tn), BK):
            for idx in range(tid, BK * E, BQ):
                jj = idx // E
                e = idx - jj * E
                if j0 + jj < Tn:
                    ks[jj, e] = qkv[b, j0 + jj, ko + e]
                    vs[jj, e] = qkv[b, j0 + jj, vo + e]
            cuda.syncthreads()
            if i < Tn and j0 <= i:
                for jj in range(min(BK, i + 1 - j0)):
                    sdot = T(0.0)
                    dp = T(0.0)
                    for e in range(E):
                        sdot += q[e] * ks[jj, e]
                        dp += do[e] * vs[jj, e]
                    p = math.exp(sdot * scale - li)
                    ds = p * (dp - di) * scale
                    for e in range(E):
                        dq[e] += ds * ks[jj, e]
            cuda.syncthreads()
        if i < Tn:
            for e in range(E):
                dqkv[b, i, qo + e] = dq[e]

    @cuda.jit
    def backward_dkv_kernel(dqkv, dsum, dout, qkv, lse, H, G, scale):
        """dK, dV parts of dqkv; grid (T / BK, B G), BK threads, one key row each."""
        B, Tn, _ = qkv.shape
        T = qkv.dtype.type
        qs = cuda.shared.array((BQ, E), float32)
        dos = cuda.shared.array((BQ, E), float32)
        ls = cuda.shared.array(BQ, float32)
        ds_ = cuda.shared.array(BQ, float32)
        k = cuda.local.array(E, float32)
        v = cuda.local.array(E, float32)
        dk = cuda.local.array(E, float32)
        dv = cuda.local.array(E, float32)
        rep = H // G
        b = cuda.blockIdx.y // G
        g = cuda.blockIdx.y % G
        ko = H * E + g * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        j0 = cuda.blockIdx.x * BK
        j = j0 + tid
        if j < Tn:
            for e in range(E):
                k[e] = qkv[b, j, ko + e]
                v[e] = qkv[b, j, vo + e]
                dk[e] = T(0.0)
                dv[e] = T(0.0)
        for hh in range(rep):
            h = g * rep + hh
            qo = h * E
            for i0 in range(j0, Tn, BQ):
                for idx in range(tid, BQ * E, BK):
                    ii = idx // E
                    e = idx - ii * E
                    if i0 + ii < Tn:
                        qs[ii, e] = qkv[b, i0 + ii, qo + e]
                        dos[ii, e] = dout[b, i0 + ii, qo + e]
                for ii in range(tid, BQ, BK):
                    if i0 + ii < Tn:
                        ls[ii] = lse[b, h, i0 + ii]
                        ds_[ii] = dsum[b, h, i0 + ii]
                cuda.syncthreads()
                if j < Tn:
                    for ii in range(max(0, j - i0), min(BQ, Tn - i0)):
                        sdot = T(0.0)
                        dp = T(0.0)
                        for e in range(E):
                            sdot += qs[ii, e] * k[e]
                            dp += dos[ii, e] * v[e]
                        p = math.exp(sdot * scale - ls[ii])
                        dsc = p * (dp - ds_[ii]) * scale
                        for e in range(E):
                            dk[e] += dsc * qs[ii, e]
                            dv[e] += p * dos[ii, e]
                cuda.syncthreads()
        if j < Tn:
            for e in range(E):
                dqkv[b, j, ko + e] = dk[e]
                dqkv[b, j, vo + e] = dv[e]

    return forward_kernel, backward_dq_kernel, backward_dkv_kernel


def kernels(E: int, BQ: int, BK: int):
    """The (forward, dq, dkv) kernels for these sizes, built once."""
    key = (E, BQ, BK)
    if key not in _KERNELS:
        _KERNELS[key] = _build(E, BQ, BK)
    return _KERNELS[key]


def _raise_shared_limit(kernel, args, nbytes: int) -> None:
    """Let kernel (compiled for args' types) use nbytes of dynamic shared memory.

    Over 48 KB a kernel must opt in (cuKernelSetAttribute) once per compiled signature.
    """
    sig = tuple(numba.typeof(a) for a in args)
    if (kernel, sig) in _SHARED_RAISED:
        return
    from numba.cuda.cudadrv.driver import binding, driver

    fn = kernel.compile(sig)._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)
    _SHARED_RAISED.add((kernel, sig))


def launch_dynamic(kernel, grid, threads: int, stream, nbytes: int, *args) -> None:
    """Launch a kernel with nbytes of dynamic shared memory (0: its array is static),
    raising its limit first where nbytes is over the 48 KB a kernel gets unasked."""
    if not SIMULATOR and nbytes > 48 * 1024:
        _raise_shared_limit(kernel, args, nbytes)
    kernel[grid, threads, stream, nbytes](*args)


PREP_MAX_THREADS = 1024  # a prep block takes the heads of a row that fit in this many


@cuda.jit
def backward_prep_kernel(dqkv, dsum, dout, out, shift, per):
    """dsum (B, H, T) = rowsum(dO O) per (b, t, h) row, and dQ's columns of dqkv zeroed;
    float32, E / 4 = 2^shift lanes a head (at most 32). Grid (T, B, H E / 4 / per), blocks
    of per (rounded up to whole warps) threads: thread k of block z takes 16-byte chunk
    z per + k of row (b, t), so its head is a shift away and no index is divided; the
    E / 4 lanes of a head sum by shuffles.

    On the H200 at T=512 this took 0.040 ms (3.8 TB/s) where a 1-d grid, with six 64-bit
    divisions a thread, took 0.059 (bench/labs/prep_variants.py; 4 rows a thread: no faster).
    A warp a row with 4-byte accesses took 0.126; zeroing dQ in a kernel of its own, 0.101
    with the reads (bench/labs/attention_backward_parts.py)."""
    T = out.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    k = cuda.blockIdx.z * per + tid
    b, i, c, L = cuda.blockIdx.y, cuda.blockIdx.x, 4 * k, 1 << shift
    s = T(0.0)
    if tid < per:
        o0, o1, o2, o3 = load4_3d(out, b, i, c)
        d0, d1, d2, d3 = load4_3d(dout, b, i, c)
        z = T(0.0)
        store4_3d(dqkv, b, i, c, z, z, z, z)
        s = d0 * o0 + d1 * o1 + d2 * o2 + d3 * o3
    s = group_sum(s, buf, T(0.0), L)  # every thread calls it: the simulator's is a barrier
    if tid < per and k & (L - 1) == 0:
        dsum[b, k >> shift, i] = s


def prep_launch(B: int, Tn: int, H: int, E: int) -> tuple[tuple, int, int, int]:
    """(grid, threads, shift, per) of backward_prep_kernel: per = E / 4 lanes times the
    most heads dividing H that fit PREP_MAX_THREADS; threads, per rounded up to whole warps
    (the shuffles name all 32 lanes)."""
    L = E // 4
    heads = max(d for d in range(1, H + 1) if H % d == 0 and d * L <= PREP_MAX_THREADS)
    per = heads * L
    return (Tn, B, H // heads), -(-per // 32) * 32, L.bit_length() - 1, per


def backward_prep(dqkv, dsum, dout, out, H: int, E: int, stream=0) -> None:
    """dsum (B, H, T) = rowsum(dO O) per head, dQ's part of dqkv (B, T, (H + 2G) E) zeroed:
    what the backwards that add dQ with atomics start from (16-byte aligned arrays)."""
    if E not in (8, 16, 32, 64, 128):
        raise ValueError(f"attention backward_prep: no prep kernel for head size {E}")
    check_aligned(dqkv, dout, out)
    B, Tn, _ = out.shape
    grid, threads, shift, per = prep_launch(B, Tn, H, E)
    backward_prep_kernel[grid, threads, stream](dqkv, dsum, dout, out, shift, per)


def _check(qkv, H, G, E) -> tuple[int, int]:
    B, Tn, C = qkv.shape
    check_shapes("attention", qkv=(qkv, (B, Tn, (H + 2 * G) * E)))
    if G < 1 or H % G or E % 2:
        raise ValueError(f"attention: H={H} query heads need G={G} dividing them, even E={E}")
    return B, Tn


def attention_forward(out, lse, qkv, H, G, E, stream=0, tile: int = 0) -> None:
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E)."""
    B, Tn = _check(qkv, H, G, E)
    check_shapes("attention_forward", out=(out, (B, Tn, H * E)), lse=(lse, (B, H, Tn)))
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    if not tile and attention_tiles.supports(E):
        check_aligned(qkv)
        fwd = attention_tiles.kernels(E)[0]
        nbytes = attention_tiles.shared_bytes(E)["forward"]
        grid = (B * H, (Tn + 63) // 64)
        args = (out, lse, qkv, H, G, scale)
        launch_dynamic(fwd, grid, attention_tiles.THREADS, stream, nbytes, *args)
        return
    t = tile or tile_for(E)
    fwd, _, _ = kernels(E, t, t)
    fwd[((Tn + t - 1) // t, B * H), t, stream](out, lse, qkv, H, G, scale)


def attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, stream=0, tile: int = 0) -> None:
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    dsum (B, H, T) is scratch for D_i = rowsum(dO * O). With P = exp(S - lse) recomputed:
    dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K / sqrt(E), dK = dS^T Q / sqrt(E).
    """
    B, Tn = _check(qkv, H, G, E)
    rows, stats = (B, Tn, H * E), (B, H, Tn)
    check_shapes("attention_backward", dqkv=(dqkv, qkv.shape), out=(out, rows),
                 dout=(dout, rows), lse=(lse, stats), dsum=(dsum, stats))  # fmt: skip
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    if not tile and attention_tiles.supports(E):
        check_aligned(qkv, dout)
        dkv, nbytes = attention_tiles.kernels(E)[1], attention_tiles.shared_bytes(E)["dkv"]
        backward_prep(dqkv, dsum, dout, out, H, E, stream)
        args = (dqkv, dsum, dout, qkv, lse, H, G, scale)
        grid = (B * G, (Tn + 63) // 64)
        launch_dynamic(dkv, grid, attention_tiles.THREADS, stream, nbytes, *args)
        return
    t = tile or tile_for(E)
    _, dq, dkv = kernels(E, t, t)
    grid_t = (Tn + t - 1) // t
    dq[(grid_t, B * H), t, stream](dqkv, dsum, dout, qkv, out, lse, H, G, scale)
    dkv[(grid_t, B * G), t, stream](dqkv, dsum, dout, qkv, lse, H, G, scale)
