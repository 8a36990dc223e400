"""Causal grouped-query FlashAttention-2 on the GPU, exact fp32: the readable kernels.

This file is the GPU twin of euler/cpu/attention.py: the same math (layer_math's
`online_softmax_rescale`, `exp_`, `softmax_grad`) called in the same order, scheduled for
a GPU block instead of a CPU thread. It runs for `--exact-attention` and `--precision fp32`
(GpuBackend with tf32=False or tc_attention=False) and for any head size the tensor-core
kernels (attention_tc/) do not take. Any head size E up to 383 runs (its tiles must fit
48 KB of shared memory); E is a compile-time constant, so the kernels are built per
(E, tile sizes).

Schedule. A block owns R (64) consecutive rows, one a thread: query rows in the forward
and in dQ, key rows in dK, dV. The other operand streams through shared memory in tiles of
K rows (`tiles`), each copied once by the whole block (consecutive threads read
consecutive elements: coalesced) and then read by every thread at the same address (a
broadcast, no bank conflict). The block's own rows come the same way into (R, E + 1)
shared arrays, padded so that 32 threads reading their own rows hit 32 banks, and the
results leave through them. The forward holds its q row in registers; the backward kernels
leave their own rows (Q and dO; K and V) in shared memory, which keeps only the gradient
accumulators in registers: at E = 64 ptxas gives the three kernels 170, 128 and 219
registers and no spills (bench/ptx_registers.py --kernels readable). The backward needs no
atomics: dQ by query rows (which also saves D = rowsum(dO O)), then dK, dV by key rows,
visiting the query rows of every query head of its kv head. No T x T matrix is ever
stored: the backward recomputes P from the logsumexp.

qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query head h reads kv
head h // (H / G).

CPU twin, step by step (euler/cpu/attention.py on the left; r: a row of the CPU's eight,
tid: the GPU thread's row, jj: a key of the tile):

| CPU `attention_forward`                  | GPU `forward_kernel`                         |
|------------------------------------------|----------------------------------------------|
| `qb[r, e] = qkv[b, i, qo + e] * scale`   | `q[e] = stage[tid, e] * scale`               |
| `for j0 in range(0, last + 1, tile)`     | `for j0 in range(0, min(i0 + R, Tn), K)`     |
| K, V copied to scratch once per head     | K, V tiles to shared: `load_tile(ks / vs)`   |
| `_scores8`: S = Q K^T                    | `s[jj] = dot`, `mt = max(mt, dot)`           |
| `valid = min(n, ... - j0 + 1)` (causal)  | `valid = min(K, i + 1 - j0)`                 |
| `m_new = max(m[r], mt)`                  | `m_new = max(m, mt)`                         |
| `online_softmax_rescale(m[r], m_new, T)` | `online_softmax_rescale(m, m_new, T)`        |
| `acc[r, e] *= alpha`                     | `acc[e] *= alpha`                            |
| `p = exp_(s[r, j] - m_new)`, `total += p`| `p = exp_(s[jj] - m_new)`, `total += p`      |
| `l[r] = l[r] * alpha + total`            | `l = l * alpha + total`                      |
| `_accumulate8`: O += P V                 | `acc[e] += p * vs[jj, e]`                    |
| `out = acc * inv`, `lse = m + log(l)`    | the same, out through `stage`                |

| CPU `attention_backward`                 | GPU                                          |
|------------------------------------------|----------------------------------------------|
| `d += dob[r, e] * out[b, i, qo + e]`     | dq kernel: `di += dost[tid, e] * qst[tid, e]` |
| `_scores8` twice: S, dP = dO V^T         | both kernels: `sdot`, `dp`                   |
| `p = exp_(s[r, j] * scale - li[r])`      | both: `p = exp_(sdot * scale - li)`          |
| `softmax_grad(p, dp[r, j], di[r]) * scale` | both: `softmax_grad(p, dp, di) * scale`    |
| `_accumulate8(dq, dp, kt, ...)`: dQ += dS K | dq kernel: `dq[e] += ds * ks[jj, e]`      |
| `_rank8_update(dk, dp, qb, ...)`          | dkv kernel: `dk[e] += ds * qs[ii, e]`       |
| `_rank8_update(dv, s, dob, ...)`          | dkv kernel: `dv[e] += p * dos[ii, e]`       |

The exact kernels this file replaced (generated, register-tiled: 64 x 64 score tiles in
registers, 16-byte shared loads) are bench/labs/attention_exact_tiles.py, and
bench/attention_exact_gpu.py times both beside the tensor cores; the
tensor-core kernels that run by default are attention_tc/ (docs/gpu.md maps them to this
file). The end of this file holds two helpers the tensor-core launchers share:
`launch_dynamic` and `backward_prep`.
"""

from __future__ import annotations

import math
from functools import cache

import numba
from numba import cuda, float32

from euler.backend import check_shapes
from euler.gpu.async_copy import check_aligned
from euler.gpu.reduce import MAX_THREADS, group_sum
from euler.gpu.vector import load4_3d, store4_3d
from euler.layer_math import exp_, online_softmax_rescale, softmax_grad

ROWS = 64  # rows a block owns, one a thread
SHARED_BYTES = 48 * 1024  # static shared memory a block gets without opting in


def shared_bytes(E: int, rows: int, keys: int) -> int:
    """Shared memory of the largest kernel (dK, dV): two padded (rows, E + 1) arrays of the
    block's own rows, two (keys, E) tiles and two (keys,) rows of statistics, float32."""
    return 4 * (2 * rows * (E + 1) + 2 * keys * E + 2 * keys)


def tiles(E: int) -> tuple[int, int]:
    """(rows, keys) for head size E: ROWS rows a block and the longest tile of streamed rows
    (a power of two, at most rows) that fits SHARED_BYTES; fewer rows where none does."""
    for rows in (ROWS, 32, 16, 8):
        for keys in (64, 32, 16, 8):
            if keys <= rows and shared_bytes(E, rows, keys) <= SHARED_BYTES:
                return rows, keys
    raise ValueError(f"attention: head size E={E} leaves no tiles that fit in shared memory")


def _build(E: int, R: int, K: int):
    """The three kernels for head size E, R rows a block (one a thread), tiles of K rows."""
    PAD = E + 1  # a stage row: own rows of 32 threads in 32 banks (a constant: an array shape)

    @cuda.jit(device=True, inline=True)
    def load_tile(tile, src, b, row0, col, Tn, n):
        """tile[r, e] = src[b, row0 + r, col + e] for r < n, e < E (0 past the sequence),
        the block's threads taking consecutive elements: coalesced reads."""
        for idx in range(cuda.threadIdx.x, n * E, cuda.blockDim.x):
            r = idx // E
            e = idx - r * E
            tile[r, e] = src[b, row0 + r, col + e] if row0 + r < Tn else float32(0.0)

    @cuda.jit(device=True, inline=True)
    def store_tile(dst, tile, b, row0, col, Tn):
        """dst[b, row0 + r, col + e] = tile[r, e] for the block's R rows inside the sequence."""
        for idx in range(cuda.threadIdx.x, R * E, cuda.blockDim.x):
            r = idx // E
            e = idx - r * E
            if row0 + r < Tn:
                dst[b, row0 + r, col + e] = tile[r, e]

    @cuda.jit
    def forward_kernel(out, lse, qkv, H, G, scale):
        """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E);
        grid (T / R, B H), R threads, query row i0 + tid each."""
        Tn = qkv.shape[1]
        T = qkv.dtype.type
        stage = cuda.shared.array((R, PAD), float32)
        ks = cuda.shared.array((K, E), float32)
        vs = cuda.shared.array((K, E), float32)
        q = cuda.local.array(E, float32)
        acc = cuda.local.array(E, float32)
        s = cuda.local.array(K, float32)
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        qo = h * E
        ko = H * E + (h // (H // G)) * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        i0 = cuda.blockIdx.x * R
        i = i0 + tid
        load_tile(stage, qkv, b, i0, qo, Tn, R)
        cuda.syncthreads()
        for e in range(E):
            q[e] = stage[tid, e] * scale
            acc[e] = T(0.0)
        m = T(-math.inf)
        l = T(0.0)
        for j0 in range(0, min(i0 + R, Tn), K):
            cuda.syncthreads()  # every thread is done with the previous K, V tiles
            load_tile(ks, qkv, b, j0, ko, Tn, K)
            load_tile(vs, qkv, b, j0, vo, Tn, K)
            cuda.syncthreads()
            valid = min(K, i + 1 - j0) if i < Tn else 0  # causal: keys j <= i
            if valid > 0:
                mt = T(-math.inf)
                for jj in range(valid):  # S = Q K^T, this row's part of the tile
                    dot = T(0.0)
                    for e in range(E):
                        dot += q[e] * ks[jj, e]
                    s[jj] = dot
                    mt = max(mt, dot)
                m_new = max(m, mt)
                alpha = online_softmax_rescale(m, m_new, T)
                for e in range(E):
                    acc[e] *= alpha
                total = T(0.0)
                for jj in range(valid):
                    p = exp_(s[jj] - m_new)
                    s[jj] = p
                    total += p
                l = l * alpha + total
                m = m_new
                for jj in range(valid):  # O += P V
                    p = s[jj]
                    for e in range(E):
                        acc[e] += p * vs[jj, e]
        cuda.syncthreads()  # stage is free: out leaves through it
        if i < Tn:
            inv = T(1.0) / l
            for e in range(E):
                stage[tid, e] = acc[e] * inv
            lse[b, h, i] = m + math.log(l)
        cuda.syncthreads()
        store_tile(out, stage, b, i0, qo, Tn)

    @cuda.jit
    def backward_dq_kernel(dqkv, dsum, dout, qkv, out, lse, H, G, scale):
        """dQ's columns of dqkv, assigned, and dsum (B, H, T) = D = rowsum(dO O);
        grid (T / R, B H), R threads, query row i0 + tid each."""
        Tn = qkv.shape[1]
        T = qkv.dtype.type
        # the block's Q and dO rows stay in shared memory (a thread reads its own row, free
        # of bank conflicts): in registers beside dQ they would spill
        qst = cuda.shared.array((R, PAD), float32)
        dost = cuda.shared.array((R, PAD), float32)
        ks = cuda.shared.array((K, E), float32)
        vs = cuda.shared.array((K, E), float32)
        dq = cuda.local.array(E, float32)
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        qo = h * E
        ko = H * E + (h // (H // G)) * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        i0 = cuda.blockIdx.x * R
        i = i0 + tid
        load_tile(qst, out, b, i0, qo, Tn, R)  # O, which only D needs, before Q
        load_tile(dost, dout, b, i0, qo, Tn, R)
        cuda.syncthreads()
        di = T(0.0)
        for e in range(E):
            di += dost[tid, e] * qst[tid, e]
            dq[e] = T(0.0)
        cuda.syncthreads()
        load_tile(qst, qkv, b, i0, qo, Tn, R)  # the loop's first barrier precedes its reads
        li = T(0.0)
        if i < Tn:
            li = lse[b, h, i]
            dsum[b, h, i] = di
        for j0 in range(0, min(i0 + R, Tn), K):
            cuda.syncthreads()  # every thread is done with the previous K, V tiles
            load_tile(ks, qkv, b, j0, ko, Tn, K)
            load_tile(vs, qkv, b, j0, vo, Tn, K)
            cuda.syncthreads()
            valid = min(K, i + 1 - j0) if i < Tn else 0  # causal: keys j <= i
            for jj in range(valid):
                sdot = T(0.0)
                dp = T(0.0)
                for e in range(E):  # S = Q K^T and dP = dO V^T, this row's part
                    sdot += qst[tid, e] * ks[jj, e]
                    dp += dost[tid, e] * vs[jj, e]
                p = exp_(sdot * scale - li)
                ds = softmax_grad(p, dp, di) * scale
                for e in range(E):  # dQ += dS K
                    dq[e] += ds * ks[jj, e]
        cuda.syncthreads()  # Q is read: dQ leaves through its array
        for e in range(E):
            qst[tid, e] = dq[e]
        cuda.syncthreads()
        store_tile(dqkv, qst, b, i0, qo, Tn)

    @cuda.jit
    def backward_dkv_kernel(dqkv, dsum, dout, qkv, lse, H, G, scale):
        """dK's and dV's columns of dqkv, assigned, from dsum (the dQ kernel's D);
        grid (T / R, B G), R threads, key row j0 + tid each, over every head of its group."""
        Tn = qkv.shape[1]
        T = qkv.dtype.type
        # the block's K and V rows stay in shared memory (a thread reads its own row, free
        # of bank conflicts): in registers beside dK and dV they would spill
        kst = cuda.shared.array((R, PAD), float32)
        vst = cuda.shared.array((R, PAD), float32)
        qs = cuda.shared.array((K, E), float32)
        dos = cuda.shared.array((K, E), float32)
        ls = cuda.shared.array(K, float32)
        ds_ = cuda.shared.array(K, float32)
        dk = cuda.local.array(E, float32)
        dv = cuda.local.array(E, float32)
        rep = H // G
        b, g = cuda.blockIdx.y // G, cuda.blockIdx.y % G
        ko = H * E + g * E
        vo = ko + G * E
        tid = cuda.threadIdx.x
        j0 = cuda.blockIdx.x * R
        j = j0 + tid
        load_tile(kst, qkv, b, j0, ko, Tn, R)
        load_tile(vst, qkv, b, j0, vo, Tn, R)
        for e in range(E):
            dk[e] = T(0.0)
            dv[e] = T(0.0)
        for hh in range(rep):
            h = g * rep + hh
            qo = h * E
            for i0 in range(j0, Tn, K):  # causal: only queries i >= j0 see these keys
                cuda.syncthreads()  # every thread is done with the previous tiles
                load_tile(qs, qkv, b, i0, qo, Tn, K)
                load_tile(dos, dout, b, i0, qo, Tn, K)
                for ii in range(tid, K, R):
                    if i0 + ii < Tn:
                        ls[ii] = lse[b, h, i0 + ii]
                        ds_[ii] = dsum[b, h, i0 + ii]
                cuda.syncthreads()
                if j < Tn:
                    for ii in range(max(0, j - i0), min(K, Tn - i0)):  # queries i >= j
                        sdot = T(0.0)
                        dp = T(0.0)
                        for e in range(E):  # S = Q K^T and dP = dO V^T, this key's part
                            sdot += qs[ii, e] * kst[tid, e]
                            dp += dos[ii, e] * vst[tid, e]
                        p = exp_(sdot * scale - ls[ii])
                        ds = softmax_grad(p, dp, ds_[ii]) * scale
                        for e in range(E):  # dK += dS^T Q, dV += P^T dO
                            dk[e] += ds * qs[ii, e]
                            dv[e] += p * dos[ii, e]
        cuda.syncthreads()  # K and V are read: dK and dV leave through their arrays
        for e in range(E):
            kst[tid, e] = dk[e]
            vst[tid, e] = dv[e]
        cuda.syncthreads()
        store_tile(dqkv, kst, b, j0, ko, Tn)
        store_tile(dqkv, vst, b, j0, vo, Tn)

    return forward_kernel, backward_dq_kernel, backward_dkv_kernel


@cache
def kernels(E: int, rows: int, keys: int):
    """The (forward, dq, dkv) kernels for these sizes, built once for the process (compiled
    code is a pure function of the sizes)."""
    return _build(E, rows, keys)


def _check(qkv, H, G, E, tile) -> tuple[int, int, int, int]:
    """(B, T, rows, keys) after checking qkv's shape, the heads and the tile size."""
    B, Tn, C = qkv.shape
    check_shapes("attention", qkv=(qkv, (B, Tn, (H + 2 * G) * E)))
    if G < 1 or H % G or E < 1:
        raise ValueError(f"attention: H={H} query heads need G={G} dividing them, E={E} >= 1")
    if not tile:
        return B, Tn, *tiles(E)
    if shared_bytes(E, tile, tile) > SHARED_BYTES:
        raise ValueError(f"attention: tile {tile} at head size E={E} overflows shared memory")
    return B, Tn, tile, tile


def attention_forward(out, lse, qkv, H, G, E, stream=0, tile: int = 0) -> None:
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E).

    tile (0: tiles(E)) sets both the rows a block owns and the streamed tile (tests)."""
    B, Tn, rows, keys = _check(qkv, H, G, E, tile)
    check_shapes("attention_forward", out=(out, (B, Tn, H * E)), lse=(lse, (B, H, Tn)))
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    forward = kernels(E, rows, keys)[0]
    forward[((Tn + rows - 1) // rows, B * H), rows, stream](out, lse, qkv, H, G, scale)


def attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, stream=0, tile: int = 0) -> None:
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    dsum (B, H, T) is scratch for D_i = rowsum(dO * O). With P = exp(S - lse) recomputed:
    dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K / sqrt(E), dK = dS^T Q / sqrt(E).
    """
    B, Tn, rows, keys = _check(qkv, H, G, E, tile)
    shapes = (B, Tn, H * E), (B, H, Tn)
    check_shapes("attention_backward", dqkv=(dqkv, qkv.shape), out=(out, shapes[0]),
                 dout=(dout, shapes[0]), lse=(lse, shapes[1]), dsum=(dsum, shapes[1]))  # fmt: skip
    scale = qkv.dtype.type(1.0 / math.sqrt(E))
    _, dq, dkv = kernels(E, rows, keys)
    blocks = (Tn + rows - 1) // rows
    dq[(blocks, B * H), rows, stream](dqkv, dsum, dout, qkv, out, lse, H, G, scale)
    dkv[(blocks, B * G), rows, stream](dqkv, dsum, dout, qkv, lse, H, G, scale)

    # ------------------------------------------------ shared with the tensor-core launchers


@cache
def _raise_shared_limit(kernel, sig: tuple, nbytes: int) -> None:
    """Let kernel, compiled for the argument types sig, use nbytes of dynamic shared memory.

    Over 48 KB a kernel must opt in (cuKernelSetAttribute), once per compiled function:
    the attribute belongs to the compiled code, which lives as long as the process.
    """
    from numba.cuda.cudadrv.driver import binding, driver

    fn = kernel.compile(sig)._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)


def launch_dynamic(kernel, grid, threads: int, stream, nbytes: int, *args) -> None:
    """Launch a kernel with nbytes of dynamic shared memory (0: its array is static),
    raising its limit first where nbytes is over the 48 KB a kernel gets unasked (not in the
    simulator, which has no limit to raise)."""
    if not numba.config.ENABLE_CUDASIM and nbytes > SHARED_BYTES:
        _raise_shared_limit(kernel, tuple(numba.typeof(a) for a in args), nbytes)
    kernel[grid, threads, stream, nbytes](*args)


PREP_MAX_THREADS = 1024  # a prep block takes the heads of a row that fit in this many


@cuda.jit
def backward_prep_kernel(dqkv, dsum, dout, out, shift, per):
    """dsum (B, H, T) = rowsum(dO O) per (b, t, h) row, and dQ's columns of dqkv zeroed;
    float32, E / 4 = 2^shift lanes a head (at most 32). Grid (T, B, H E / 4 / per), blocks
    of per (rounded up to whole warps) threads: thread k of block z takes 16-byte chunk
    z per + k of row (b, t), so its head is a shift away and no index is divided; the
    E / 4 lanes of a head sum by shuffles. The 3-d grid spares the 64-bit index divisions
    of a 1-d one, which took half as long again (bench/labs/prep_variants.py;
    docs/measurements.md)."""
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
