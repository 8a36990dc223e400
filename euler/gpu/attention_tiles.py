"""Register-tiled FlashAttention kernels (the FlashAttention-2 structure on fp32 CUDA cores).

A block of 128 threads owns a 64 x 64 tile of scores: thread (ty, tx) = (tid // 8, tid % 8)
holds rows r_i = 4 ty + i (i < 4) and columns c_j = tx + 8 j (j < 8) in registers, and an
E-wide output tile of rows r_i and columns c_j (j < E / 8). Every operand is staged in one
dynamic shared-memory array, transposed so that a product's k index is the slow one
(X^T[k][row], rows padded to LD = 65 floats): a product step then reads 4 + 8 words at
fixed offsets from two base addresses for 32 FMAs, the broadcast and consecutive reads
are free of bank conflicts, and so are the staging stores (consecutive k, one row). A
row's max and sum over its 8 column threads use warp shuffles (shared memory in the
simulator).

NVVM does not unroll the register-tile loops itself, and register arrays indexed in a
loop would live in local memory, so the kernel source is generated with those loops
written out (one scalar per register, k unrolled by 8 so that each load is a base plus
a constant) and compiled per head size E (8, 16, 32 or 64).

forward: one block per (64 query rows, b, h): S = Q K^T, online softmax, O += P V.
backward_dkv: one block per (64 key rows, b, kv head g), over the query tiles of every
  head of its group: P = exp(S - lse), dP = dO V^T, dS = P (dP - D), dV += P^T dO,
  dK += dS^T Q, and dQ += dS K added to dqkv with atomics (ATOMIC_DQ; D = rowsum(dO O)
  and the zeroed dQ come from attention.backward_prep_kernel).
backward_dq (without ATOMIC_DQ): one block per (64 query rows, b, h) computes D and dQ on
  its own, recomputing S and dP, and backward_dkv leaves dQ alone.

The grid's slow (y) axis is the causal work per block, heaviest first: the blocks that
visit the most tiles start in the first wave rather than trailing the last one.
"""

from __future__ import annotations

from euler.gpu.generated import Source, compile_generated

THREADS = 128
LD = 65  # padded row of a staged tile, in floats
RED = 64 * 8  # floats of shared scratch for the simulator's row reductions
UNROLL = 8  # product steps written out per loop iteration
LOAD_CHUNK = 8  # staging loads in flight per tile before their stores
MIN_BLOCKS = 0  # launch bound: blocks per multiprocessor to fit (0: no register cap)
# Shared-memory offsets as uint64: numba then emits no negative-index wraparound test.
# On the H200 (B=32, H=12, G=4, E=64, T=512) this took the forward from 1.37 to 0.76 ms
# and the backward from 5.21 to 2.86 ms, and registers from 254 to 128 (forward).
UNSIGNED_OFFSETS = True
# Backward in one kernel per key tile that also adds dQ = dS K into dqkv with atomics (five
# tile products per tile pair), instead of a second kernel per query tile that recomputes
# S and dP for dQ (seven).
ATOMIC_DQ = True


def _ix(n) -> str:
    """A shared-memory offset term, uint64 when UNSIGNED_OFFSETS."""
    return f"uint64({n})" if UNSIGNED_OFFSETS else str(n)


def supports(E: int) -> bool:
    """Head sizes these kernels are generated for (E must divide the 128 threads)."""
    return E in (8, 16, 32, 64)


def _prologue(w: Source) -> None:
    w("tid = cuda.threadIdx.x", "tx = tid % 8", "ty4 = (tid // 8) * 4")
    w("sm = cuda.shared.array(0, float32)")
    w(*(f"r{i} = ty4 + {i}" for i in range(4)))
    w(*(f"c{j} = tx + {8 * j}" for j in range(8)))


def _stage(w: Source, E: int, tiles: list[tuple]) -> None:
    """Stage 64-row tiles (off, row0, col, src, scale) of src (B, T, C) as X^T at sm[off].

    Thread tid takes column tid % E of rows tid // E + 128 / E * it: all of a chunk's loads
    are issued before its stores, so their memory latencies overlap (a plain loop would
    wait for each load in turn). Rows past the sequence are staged as zeros.
    """
    step, n = 128 // E, E // 2  # rows per pass of the block, passes per tile
    w(f"ee = tid % {E}", f"rb = tid // {E}")
    for t, tile in enumerate(tiles):
        w(f"sb{t} = {_ix(f'{tile[0]} + ee * {LD} + rb')}")
    for it0 in range(0, n, LOAD_CHUNK):
        its = range(it0, min(n, it0 + LOAD_CHUNK))
        for t, (_, row0, col, src, scale) in enumerate(tiles):
            for it in its:
                row = f"{row0} + rb + {it * step}"
                w(f"v{t}_{it} = {src}[b, {row}, {col} + ee]{scale} if {row} < Tn else T(0.0)")
        for t in range(len(tiles)):
            w(*(f"sm[sb{t} + {_ix(it * step)}] = v{t}_{it}" for it in its))


def _product(w, acc, a_off, b_off, b_mode, K, ncols) -> None:
    """acc{i}_{j} += sum_k A[r_i][k] B[k][c_j] for k < K, A staged as [k][row] at a_off.

    b_mode "kmajor": B staged as [k][col]; "colmajor": B staged as [col][k] (a tile whose
    other index is the one summed over).
    """
    w(f"for k0 in range(0, {K}, {UNROLL}):")
    w.level += 1
    w(f"ab = {_ix(f'{a_off} + k0 * {LD} + ty4')}")
    b_base = f"{b_off} + k0 * {LD} + tx" if b_mode == "kmajor" else f"{b_off} + tx * {LD} + k0"
    w(f"bb = {_ix(b_base)}")
    for u in range(UNROLL):
        w(*(f"a{i} = sm[ab + {_ix(u * LD + i)}]" for i in range(4)))
        if b_mode == "kmajor":
            w(*(f"b{j} = sm[bb + {_ix(u * LD + 8 * j)}]" for j in range(ncols)))
        else:
            w(*(f"b{j} = sm[bb + {_ix(8 * j * LD + u)}]" for j in range(ncols)))
        w(*(f"{acc}{i}_{j} += a{i} * b{j}" for i in range(4) for j in range(ncols)))
    w.level -= 1


def _zero(w, acc, ncols) -> None:
    w(*(f"{acc}{i}_{j} = T(0.0)" for i in range(4) for j in range(ncols)))


def _group(w, op: str, names: list[str], red: int) -> None:
    """Each name becomes op over the 8 threads of its row (lanes differing in tx).

    The simulator has no shuffles: there the values meet in shared scratch at sm[red].
    """
    w("if SIMULATOR:")
    w.level += 1
    w(*(f"sm[{red} + r{i} * 8 + tx] = {n}" for i, n in enumerate(names)))
    w("cuda.syncthreads()")
    for i, n in enumerate(names):
        terms = [f"sm[{red} + r{i} * 8 + {t}]" for t in range(8)]
        w(f"{n} = max({', '.join(terms)})" if op == "max" else f"{n} = {' + '.join(terms)}")
    w("cuda.syncthreads()")
    w.level -= 1
    w("else:")
    w.level += 1
    for n in names:
        for off in (1, 2, 4):
            shfl = f"cuda.shfl_xor_sync(FULL_MASK, {n}, {off})"
            w(f"{n} = max({n}, {shfl})" if op == "max" else f"{n} += {shfl}")
    w.level -= 1


def _mask_diagonal(w, acc: str, rows_are_queries: bool) -> None:
    """On the diagonal tile, -inf where the key is after the query."""
    for i in range(4):
        for j in range(8):
            cond = f"c{j} > r{i}" if rows_are_queries else f"r{i} > c{j}"
            w(f"{acc}{i}_{j} = select({cond}, T(-math.inf), {acc}{i}_{j})")


def _write_tile_t(w, off: str, acc: str) -> None:
    """Store register tile M[r_i][c_j] as M^T[c][r] at sm[off]."""
    w(f"tb = {_ix(f'{off} + tx * {LD} + ty4')}")
    w(*(f"sm[tb + {_ix(8 * j * LD + i)}] = {acc}{i}_{j}" for i in range(4) for j in range(8)))


def _write_tile(w, off: str, acc: str) -> None:
    """Store register tile M[r_i][c_j] as M[r][c] at sm[off]."""
    w(f"tb = {_ix(f'{off} + ty4 * {LD} + tx')}")
    w(*(f"sm[tb + {_ix(i * LD + 8 * j)}] = {acc}{i}_{j}" for i in range(4) for j in range(8)))


def _forward_source(E: int) -> str:
    NJ = E // 8
    Q, KP, V = 0, E * LD, E * LD + max(E, 64) * LD
    w = Source()
    w("def forward_tiled_kernel(out, lse, qkv, H, G, scale):")
    w.level += 1
    w('"""out (B, T, H E), lse (B, H, T) from qkv; grid (B H, T / 64), 128 threads."""')
    w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
    _prologue(w)
    w("rep = H // G", "b = cuda.blockIdx.x // H", "h = cuda.blockIdx.x % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w("nt = (Tn + 63) // 64", "i0 = (nt - 1 - cuda.blockIdx.y) * 64")
    _stage(w, E, [(Q, "i0", "qo", "qkv", " * scale")])
    w(*(f"m{i} = T(-math.inf)" for i in range(4)), *(f"l{i} = T(0.0)" for i in range(4)))
    _zero(w, "o", NJ)
    w("for j0 in range(0, i0 + 64, 64):")
    w.level += 1
    _stage(w, E, [(KP, "j0", "ko", "qkv", ""), (V, "j0", "vo", "qkv", "")])
    w("cuda.syncthreads()")
    _zero(w, "s", 8)
    _product(w, "s", Q, KP, "kmajor", E, 8)
    w("if j0 == i0:")
    w.level += 1
    _mask_diagonal(w, "s", rows_are_queries=True)
    w.level -= 1
    w("cuda.syncthreads()  # K^T is read; its space takes P")
    for i in range(4):
        w(f"mx{i} = max(" + ", ".join(f"s{i}_{j}" for j in range(8)) + ")")
    _group(w, "max", [f"mx{i}" for i in range(4)], V + E * LD)
    for i in range(4):
        w(f"mn{i} = max(m{i}, mx{i})", f"al{i} = online_softmax_rescale(m{i}, mn{i}, T)")
        w(*(f"s{i}_{j} = math.exp(s{i}_{j} - mn{i})" for j in range(8)))
        w(f"rs{i} = " + " + ".join(f"s{i}_{j}" for j in range(8)))
    _group(w, "sum", [f"rs{i}" for i in range(4)], V + E * LD)
    for i in range(4):
        w(f"l{i} = l{i} * al{i} + rs{i}", f"m{i} = mn{i}")
        w(*(f"o{i}_{j} *= al{i}" for j in range(NJ)))
    _write_tile_t(w, str(KP), "s")
    w("cuda.syncthreads()")
    _product(w, "o", KP, V, "colmajor", 64, NJ)
    w("cuda.syncthreads()")
    w.level -= 1
    for i in range(4):
        w(f"if i0 + r{i} < Tn:")
        w.level += 1
        w(f"inv = T(1.0) / l{i}")
        w(*(f"out[b, i0 + r{i}, qo + c{j}] = o{i}_{j} * inv" for j in range(NJ)))
        w("if tx == 0:", f"    lse[b, h, i0 + r{i}] = m{i} + math.log(l{i})")
        w.level -= 1
    return w.text()


def _dq_source(E: int) -> str:
    NJ = E // 8
    Q, DO, K, V, DS = 0, E * LD, 2 * E * LD, 3 * E * LD, 4 * E * LD
    w = Source()
    w("def backward_dq_tiled_kernel(dqkv, dsum, dout, qkv, out, lse, H, G, scale):")
    w.level += 1
    w('"""dQ part of dqkv, dsum (B, H, T) = rowsum(dO O); grid (B H, T / 64), 128 threads."""')
    w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
    _prologue(w)
    w("rep = H // G", "b = cuda.blockIdx.x // H", "h = cuda.blockIdx.x % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w("nt = (Tn + 63) // 64", "i0 = (nt - 1 - cuda.blockIdx.y) * 64")
    _stage(w, E, [(Q, "i0", "qo", "qkv", " * scale"), (DO, "i0", "qo", "dout", "")])
    for i in range(4):
        w(f"d{i} = T(0.0)", f"ls{i} = T(0.0)", f"if i0 + r{i} < Tn:")
        w.level += 1
        w(f"ls{i} = lse[b, h, i0 + r{i}]")
        w(
            *(
                f"d{i} += dout[b, i0 + r{i}, qo + c{j}] * out[b, i0 + r{i}, qo + c{j}]"
                for j in range(NJ)
            )
        )
        w.level -= 1
    _group(w, "sum", [f"d{i}" for i in range(4)], DS + 64 * LD)
    for i in range(4):
        w(f"if tx == 0 and i0 + r{i} < Tn:", f"    dsum[b, h, i0 + r{i}] = d{i}")
    _zero(w, "q", NJ)
    w("for j0 in range(0, i0 + 64, 64):")
    w.level += 1
    _stage(w, E, [(K, "j0", "ko", "qkv", ""), (V, "j0", "vo", "qkv", "")])
    w("cuda.syncthreads()")
    _zero(w, "s", 8)
    _product(w, "s", Q, K, "kmajor", E, 8)
    _zero(w, "p", 8)
    _product(w, "p", DO, V, "kmajor", E, 8)
    w("if j0 == i0:")
    w.level += 1
    _mask_diagonal(w, "s", rows_are_queries=True)
    w.level -= 1
    for i in range(4):
        for j in range(8):
            w(f"s{i}_{j} = math.exp(s{i}_{j} - ls{i})", f"s{i}_{j} = s{i}_{j} * (p{i}_{j} - d{i})")
    _write_tile_t(w, str(DS), "s")
    w("cuda.syncthreads()")
    _product(w, "q", DS, K, "colmajor", 64, NJ)
    w("cuda.syncthreads()")
    w.level -= 1
    for i in range(4):
        w(f"if i0 + r{i} < Tn:")
        w(*(f"    dqkv[b, i0 + r{i}, qo + c{j}] = q{i}_{j} * scale" for j in range(NJ)))
    return w.text()


def _dkv_source(E: int) -> str:
    NJ = E // 8
    K, V, Q, DO, P, DS = 0, E * LD, 2 * E * LD, 3 * E * LD, 4 * E * LD, (4 * E + 64) * LD
    LS, DD = (4 * E + 128) * LD, (4 * E + 128) * LD + 64
    w = Source()
    w("def backward_dkv_tiled_kernel(dqkv, dsum, dout, qkv, lse, H, G, scale):")
    w.level += 1
    w('"""dK, dV (and dQ, atomic) parts of dqkv; grid (B G, T / 64), 128 threads; rows: keys."""')
    w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
    _prologue(w)
    w("rep = H // G", "b = cuda.blockIdx.x // G", "g = cuda.blockIdx.x % G")
    w(f"ko = H * {E} + g * {E}", f"vo = ko + G * {E}")
    w("j0 = cuda.blockIdx.y * 64")
    _stage(w, E, [(K, "j0", "ko", "qkv", ""), (V, "j0", "vo", "qkv", "")])
    _zero(w, "dk", NJ)
    _zero(w, "dv", NJ)
    w("for hh in range(rep):")
    w.level += 1
    w(f"qo = (g * rep + hh) * {E}", "h = g * rep + hh")
    w("for i0 in range(j0, Tn, 64):")
    w.level += 1
    _stage(w, E, [(Q, "i0", "qo", "qkv", " * scale"), (DO, "i0", "qo", "dout", "")])
    w("if tid < 64:")
    w(f"    sm[{LS} + tid] = lse[b, h, i0 + tid] if i0 + tid < Tn else T(0.0)")
    w(f"    sm[{DD} + tid] = dsum[b, h, i0 + tid] if i0 + tid < Tn else T(0.0)")
    w("cuda.syncthreads()")
    _zero(w, "s", 8)
    _product(w, "s", K, Q, "kmajor", E, 8)
    _zero(w, "p", 8)
    _product(w, "p", V, DO, "kmajor", E, 8)
    w("if j0 == i0:")
    w.level += 1
    _mask_diagonal(w, "s", rows_are_queries=False)
    w.level -= 1
    for j in range(8):
        w(f"lc{j} = sm[{LS} + c{j}]", f"dc{j} = sm[{DD} + c{j}]")
    for i in range(4):
        for j in range(8):
            w(f"s{i}_{j} = math.exp(s{i}_{j} - lc{j})", f"p{i}_{j} = s{i}_{j} * (p{i}_{j} - dc{j})")
    _write_tile_t(w, str(P), "s")
    _write_tile_t(w, str(DS), "p")
    w("cuda.syncthreads()")
    _product(w, "dv", P, DO, "colmajor", 64, NJ)
    _product(w, "dk", DS, Q, "colmajor", 64, NJ)
    w("cuda.syncthreads()")
    if ATOMIC_DQ:
        # dQ[query][e] += sum_key dS[query][key] K[key][e]: dS as [key][query] in P's space
        _write_tile(w, str(P), "p")
        w("cuda.syncthreads()")
        _zero(w, "q", NJ)
        _product(w, "q", P, K, "colmajor", 64, NJ)
        for i in range(4):
            w(f"if i0 + r{i} < Tn:")
            w.level += 1
            for j in range(NJ):
                w(f"cuda.atomic.add(dqkv, (b, i0 + r{i}, qo + c{j}), q{i}_{j} * scale)")
            w.level -= 1
        w("cuda.syncthreads()")
    w.level -= 2
    for i in range(4):
        w(f"if j0 + r{i} < Tn:")
        w(*(f"    dqkv[b, j0 + r{i}, ko + c{j}] = dk{i}_{j}" for j in range(NJ)))
        w(*(f"    dqkv[b, j0 + r{i}, vo + c{j}] = dv{i}_{j}" for j in range(NJ)))
    return w.text()


def shared_bytes(E: int) -> dict[str, int]:
    """Dynamic shared memory of each kernel, in bytes."""
    return {
        "forward": 4 * ((2 * E + max(E, 64)) * LD + RED),
        "dq": 4 * ((4 * E + 64) * LD + RED),
        "dkv": 4 * ((4 * E + 128) * LD + 128),
    }


_BUILT: dict[tuple, tuple] = {}


HEADER = """import math

from numba import cuda, float32, uint64

from euler.gpu.branchless import select
from euler.gpu.reduce import FULL_MASK, SIMULATOR
from euler.layer_math import online_softmax_rescale"""


def _compile(name: str, src: str, min_blocks: int):
    if min_blocks:
        return compile_generated(name, src, HEADER, launch_bounds=(THREADS, min_blocks))
    return compile_generated(name, src, HEADER)


def kernels(E: int):
    """(forward, dkv) dispatchers, or (forward, dq, dkv) without ATOMIC_DQ, for head size E
    (and the current generation knobs, which the kernel lab varies), built once."""
    key = (E, UNROLL, LOAD_CHUNK, MIN_BLOCKS, UNSIGNED_OFFSETS, ATOMIC_DQ)
    if key not in _BUILT:
        assert supports(E)
        srcs = {
            "forward_tiled_kernel": _forward_source(E),
            "backward_dq_tiled_kernel": _dq_source(E),
            "backward_dkv_tiled_kernel": _dkv_source(E),
        }
        if ATOMIC_DQ:
            del srcs["backward_dq_tiled_kernel"]
        _BUILT[key] = tuple(_compile(n, s, MIN_BLOCKS) for n, s in srcs.items())
    return _BUILT[key]
