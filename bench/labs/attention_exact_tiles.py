"""Kernel lab: register-tiled exact FlashAttention (FlashAttention-2 on fp32 CUDA cores).

    python bench/labs/attention_exact_tiles.py [--T 70] [--head-size 8]   # the check

This was the `--exact-attention` path until the readable kernels (euler/gpu/attention.py)
replaced it there; it stays here as the faster variant they are measured against
(bench/attention_exact_gpu.py times both; bench/labs/attention_lab_gpu.py times its
TileOptions). The package never imports it. Run as a script it checks its forward and
backward against the readable kernels on a small shape, on a GPU or in the CUDA simulator
(NUMBA_ENABLE_CUDASIM=1; a minute at the defaults).


A block of 128 threads owns a 64 x 64 tile of scores: thread (ty, tx) = (tid // 8, tid % 8)
holds rows ty + 16 i (i < 4) and columns tx + 8 j (j < 8) in registers. Every operand sits
in one dynamic shared-memory array, and a product step reads it 16 bytes at a time
(vector.load4_shared, LDS.128): 3 loads for 32 FMAs. The kernels these replaced read
4 + 8 scalars for the same 32 FMAs and were bound by shared-memory bandwidth: on the H200
(B=32, H=12, G=4, E=64, T=512, launch-free) forward 0.615 -> 0.459 ms, backward 1.897 ->
1.117 (results/attention-exact-fp32-h200-2026-11-30.json, `variants`).

A product C[m][n] += sum_k A[m][k] B[k][n] reads each operand one of two ways:
- "mk", the tile stored [m][k] (rows `ld` floats apart): a thread reads 4 consecutive k of
  each of its m, which are strided (rows ty + 16 i, columns tx + 8 j). With ld / 4 odd
  (Q, K, V, dO: ld = E + 4) or ld = 72 (P^T, dS^T) the words a warp reads fall in
  distinct banks.
- "km", the tile stored [k][m]: a thread reads 4 consecutive m at one k, its m in runs of 4
  (rows 4 ty + i; output columns 4 tx + j and 32 + 4 tx + j), so a warp reads one
  contiguous run. Under 32 output columns (E = 8, 16) the columns are tx + 8 j, read one
  float at a time.
Q, K, V and dO tiles are copied row-major ([row][e], as in qkv) by cp.async, with no
transposition: S = Q K^T reads both "mk"; O += P V reads P "mk" and V "km". The backward
writes P^T and dS^T (rows: keys) once and reads dS^T both ways, "mk" for dK += dS^T Q and
"km" for dQ += dS K.

NVVM does not unroll the register-tile loops itself, and register arrays indexed in a
loop would live in local memory, so the kernel source is generated with those loops
written out (one scalar per register, TileOptions.kstep k steps a loop iteration, so each
load is a base plus a constant) and compiled per head size E (8, 16, 32 or 64) and
TileOptions.

forward: one block per (64 query rows, b, h): S = Q K^T, online softmax, O += P V. While
  S is computed V's tile is in flight, and while P V is computed the next K tile is.
backward_dkv: one block per (64 key rows, b, kv head g), over the query tiles of every
  head of its group: P = exp(S - lse), dP = dO V^T, dS = P (dP - D), dV += P^T dO,
  dK += dS^T Q, and dQ += dS K added to dqkv with atomics (D = rowsum(dO O) and the zeroed
  dQ come from euler/gpu/attention.py's backward_prep); the next Q, dO tiles land during dS K.

The grid's slow (y) axis is the causal work per block, heaviest first: the blocks that
visit the most tiles start in the first wave rather than trailing the last one.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from euler.gpu import attention  # noqa: E402
from euler.gpu.async_copy import check_aligned  # noqa: E402
from euler.gpu.generated import Source, compile_generated  # noqa: E402
from euler.gpu.reduce import SIMULATOR  # noqa: E402

THREADS = 128
RED = 64 * 8  # floats of shared scratch for the simulator's row reductions
LDW = 72  # row of P^T and dS^T: a warp's stores at [ty + 16 i][tx + 8 j] hit all 32 banks


@dataclass(frozen=True)
class TileOptions:
    """The generator's inputs besides the head size (frozen: with E, the compile cache's key).

    kstep: k steps written out per loop iteration of a product, a multiple of 4 dividing E.
        ptxas hoists their loads, so at 8 the forward takes 248 registers (2 blocks a
        multiprocessor), at 4 167 (3); 8 runs faster on the H200 (bench/labs/attention_lab_gpu.py,
        docs/measurements.md).
    """

    kstep: int = 8

    def __post_init__(self) -> None:
        if self.kstep < 4 or self.kstep % 4:
            raise ValueError(f"TileOptions.kstep: a positive multiple of 4, not {self.kstep}")


def supports(E: int) -> bool:
    """Head sizes these kernels are generated for."""
    return E in (8, 16, 32, 64)


def _ld(E: int) -> int:
    """Row of a staged Q, K, V or dO tile, in floats: 16-byte rows, an odd count of them."""
    return E + 4


def _run(E: int) -> int:
    """Output columns a thread reads at once from a "km" tile E wide (4: one LDS.128)."""
    return 4 if E >= 32 else 1


def _u(expr) -> str:
    """A shared-memory offset as uint64: numba then emits no negative-index wraparound test
    (on the H200 this once took the forward from 1.37 to 0.76 ms)."""
    return f"uint64({expr})"


def _prologue(w: Source, E: int) -> None:
    run = _run(E)
    w("tid = cuda.threadIdx.x", "tx = tid % 8", "ty = tid // 8")
    # cp.async and LDS.128 take 16-byte aligned addresses (the simulator takes no alignment)
    w(f"sm = cuda.shared.array(0, float32{'' if SIMULATOR else ', alignment=16'})")
    w(*(f"r{i} = ty + {16 * i}" for i in range(4)))
    w(*(f"c{j} = tx + {8 * j}" for j in range(8)))
    w(*(f"e{j} = {run} * tx + {j % run + 8 * run * (j // run)}" for j in range(E // 8)))
    per = E // 4  # 16-byte pieces of a row
    w(f"qd = tid % {per}", f"rq = tid // {per}", f"sq = {_u(f'rq * {_ld(E)} + 4 * qd')}")


def _stage(w: Source, E: int, tiles: list[tuple]) -> None:
    """Start cp.async copies of 64-row tiles (off, row0, col, src) of src (B, T, C) to
    sm[off], row-major; rows past the sequence land as zeros. The caller commits them."""
    step = 4 * THREADS // E  # rows a pass of the block copies
    for off, row0, col, src in tiles:
        for it in range(64 // step):
            row = f"{row0} + rq + {it * step}"
            dst = f"sq + {_u(off + it * step * _ld(E))}"
            at = f"{src}, b, min({row}, Tn - 1), {col} + 4 * qd"
            w(f"cp_async16(sm, {dst}, {at}, select({row} < Tn, 16, 0))")


def _base(off: int, ld: int, way: str, own: str) -> str:
    """Offset of a thread's first operand word at k0; own: its index (ty for A, tx for B)
    strided ("mk") or the start of its run ("km", 4 ty for A, run * tx for B)."""
    return _u(f"{off} + {own} * {ld} + k0" if way == "mk" else f"{off} + k0 * {ld} + {own}")


def _load_runs(w: Source, names: list[str], at: str) -> None:
    """names[0..3] = sm[at .. at + 3], one 16-byte load."""
    w(f"{', '.join(names)} = load4_shared(sm, {at})")


def _product(
    w: Source, acc: str, a: tuple, b: tuple, K: int, ncols: int, E: int, kstep: int
) -> None:
    """acc{i}_{j} += sum_k A[m_i][k] B[k][n_j] for k < K, kstep k a loop iteration; a and b
    are (off, ld, way), way "mk" or "km" (module docstring). "mk" B is a 64-column score tile
    (ncols 8); "km" B an output of E columns (ncols E / 8). Operand values are a{i}_{u},
    b{j}_{u} at k = k0 + u."""
    (a_off, a_ld, a_way), (b_off, b_ld, b_way) = a, b
    run = _run(E)
    w(f"for k0 in range(0, {K}, {kstep}):")
    w.level += 1
    w("ab = " + _base(a_off, a_ld, a_way, "ty" if a_way == "mk" else "4 * ty"))
    w("bb = " + _base(b_off, b_ld, b_way, "tx" if b_way == "mk" else f"{run} * tx"))
    for k in range(0, kstep, 4):
        us = range(k, k + 4)
        if a_way == "mk":  # 4 k of row i a load
            for i in range(4):
                _load_runs(w, [f"a{i}_{u}" for u in us], f"ab + {_u(16 * i * a_ld + k)}")
        else:  # rows 4 ty .. 4 ty + 3 at one k a load
            for u in us:
                _load_runs(w, [f"a{i}_{u}" for i in range(4)], f"ab + {_u(u * a_ld)}")
        if b_way == "mk":  # 4 k of column j a load
            for j in range(ncols):
                _load_runs(w, [f"b{j}_{u}" for u in us], f"bb + {_u(8 * j * b_ld + k)}")
        elif run == 4:  # 4 columns at one k a load
            for u in us:
                for jq in range(ncols // 4):
                    names = [f"b{4 * jq + t}_{u}" for t in range(4)]
                    _load_runs(w, names, f"bb + {_u(u * b_ld + 32 * jq)}")
        else:
            for u in us:
                w(*(f"b{j}_{u} = sm[bb + {_u(u * b_ld + 8 * j)}]" for j in range(ncols)))
        for u in us:
            w(*(f"{acc}{i}_{j} += a{i}_{u} * b{j}_{u}" for i in range(4) for j in range(ncols)))
    w.level -= 1


def _zero(w: Source, acc: str, ncols: int) -> None:
    w(*(f"{acc}{i}_{j} = T(0.0)" for i in range(4) for j in range(ncols)))


def _group(w: Source, op: str, names: list[str], red: int) -> None:
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


def _mask_diagonal(w: Source, acc: str, rows_are_queries: bool) -> None:
    """On the diagonal tile, -inf where the key is after the query."""
    for i in range(4):
        for j in range(8):
            cond = f"c{j} > r{i}" if rows_are_queries else f"r{i} > c{j}"
            w(f"{acc}{i}_{j} = select({cond}, T(-math.inf), {acc}{i}_{j})")


def _write_tile(w: Source, off: int, acc: str) -> None:
    """Store score tile acc{i}_{j} (row r_i, column c_j) row-major at sm[off], rows LDW apart."""
    w(f"tb = {_u(f'{off} + ty * {LDW} + tx')}")
    w(*(f"sm[tb + {_u(16 * i * LDW + 8 * j)}] = {acc}{i}_{j}" for i in range(4) for j in range(8)))


def _layout(E: int) -> dict[str, int]:
    """Offsets (floats) of each kernel's regions in its dynamic shared array, and its end."""
    tile, wide = 64 * _ld(E), 64 * LDW
    fwd = {"Q": 0, "K": tile, "V": 2 * tile, "P": 3 * tile, "RED": 3 * tile + wide}
    dkv = {"K": 0, "V": tile, "Q": 2 * tile, "DO": 3 * tile, "PT": 4 * tile}
    dkv |= {"DS": 4 * tile + wide, "LS": 4 * tile + 2 * wide, "DD": 4 * tile + 2 * wide + 64}
    dkv["RED"] = dkv["DD"] + 64
    extra = RED if SIMULATOR else 0  # the device reduces by shuffles
    fwd["end"], dkv["end"] = fwd["RED"] + extra, dkv["RED"] + extra
    return {"forward": fwd, "dkv": dkv}


def shared_bytes(E: int) -> dict[str, int]:
    """Dynamic shared memory of each kernel, in bytes."""
    return {name: 4 * regions["end"] for name, regions in _layout(E).items()}


def _forward_source(E: int, options: TileOptions) -> str:
    NJ, LD, at = E // 8, _ld(E), _layout(E)["forward"]
    ks = options.kstep
    w = Source()
    w("def forward_tiled_kernel(out, lse, qkv, H, G, scale):")
    w.level += 1
    w('"""out (B, T, H E), lse (B, H, T) from qkv; grid (B H, T / 64), 128 threads."""')
    w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
    _prologue(w, E)
    w("rep = H // G", "b = cuda.blockIdx.x // H", "h = cuda.blockIdx.x % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w("nt = (Tn + 63) // 64", "i0 = (nt - 1 - cuda.blockIdx.y) * 64")
    _stage(w, E, [(at["Q"], "i0", "qo", "qkv"), (at["K"], "0", "ko", "qkv")])
    w("cp_async_commit()")
    _stage(w, E, [(at["V"], "0", "vo", "qkv")])
    w("cp_async_commit()")
    w(*(f"m{i} = T(-math.inf)" for i in range(4)), *(f"l{i} = T(0.0)" for i in range(4)))
    _zero(w, "o", NJ)
    w("for j0 in range(0, i0 + 64, 64):")
    w.level += 1
    w("cp_async_wait(1)  # K's tile has landed; V's may still be in flight", "cuda.syncthreads()")
    _zero(w, "s", 8)
    _product(w, "s", (at["Q"], LD, "mk"), (at["K"], LD, "mk"), E, 8, E, ks)
    w("if j0 == i0:")
    w.level += 1
    _mask_diagonal(w, "s", rows_are_queries=True)
    w.level -= 1
    w("cuda.syncthreads()  # K is read: the next tile may land there", "if j0 < i0:")
    w.level += 1
    _stage(w, E, [(at["K"], "j0 + 64", "ko", "qkv")])
    w.level -= 1
    w("cp_async_commit()")
    for i in range(4):  # scale > 0: the max of the raw scores, scaled, is the scaled max
        w(f"mx{i} = max(" + ", ".join(f"s{i}_{j}" for j in range(8)) + ") * scale")
    _group(w, "max", [f"mx{i}" for i in range(4)], at["RED"])
    for i in range(4):
        w(f"mn{i} = max(m{i}, mx{i})", f"al{i} = online_softmax_rescale(m{i}, mn{i}, T)")
        w(*(f"s{i}_{j} = math.exp(s{i}_{j} * scale - mn{i})" for j in range(8)))
        w(f"rs{i} = " + " + ".join(f"s{i}_{j}" for j in range(8)))
    _group(w, "sum", [f"rs{i}" for i in range(4)], at["RED"])
    for i in range(4):
        w(f"l{i} = l{i} * al{i} + rs{i}", f"m{i} = mn{i}")
        w(*(f"o{i}_{j} *= al{i}" for j in range(NJ)))
    _write_tile(w, at["P"], "s")
    w("cp_async_wait(1)  # V's tile has landed", "cuda.syncthreads()")
    _product(w, "o", (at["P"], LDW, "mk"), (at["V"], LD, "km"), 64, NJ, E, ks)
    w("cuda.syncthreads()  # V and P are read", "if j0 < i0:")
    w.level += 1
    _stage(w, E, [(at["V"], "j0 + 64", "vo", "qkv")])
    w.level -= 1
    w("cp_async_commit()")
    w.level -= 1
    for i in range(4):
        w(f"if i0 + r{i} < Tn:")
        w.level += 1
        w(f"inv = T(1.0) / l{i}")
        w(*(f"out[b, i0 + r{i}, qo + e{j}] = o{i}_{j} * inv" for j in range(NJ)))
        w("if tx == 0:", f"    lse[b, h, i0 + r{i}] = m{i} + math.log(l{i})")
        w.level -= 1
    return w.text()


def _dkv_source(E: int, options: TileOptions) -> str:
    NJ, LD, at = E // 8, _ld(E), _layout(E)["dkv"]
    ks = options.kstep
    w = Source()
    w("def backward_dkv_tiled_kernel(dqkv, dsum, dout, qkv, lse, H, G, scale):")
    w.level += 1
    w('"""dK, dV and (atomic) dQ parts of dqkv; grid (B G, T / 64), 128 threads; rows: keys."""')
    w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
    _prologue(w, E)
    w("rep = H // G", "b = cuda.blockIdx.x // G", "g = cuda.blockIdx.x % G")
    w(f"ko = H * {E} + g * {E}", f"vo = ko + G * {E}")
    w("j0 = cuda.blockIdx.y * 64", "h = g * rep", "i0 = j0")

    def issue_queries(i0: str, h: str) -> None:
        """Q, dO tiles of query rows i0.. of head h, with their lse and D, started."""
        _stage(w, E, [(at["Q"], i0, f"{h} * {E}", "qkv"), (at["DO"], i0, f"{h} * {E}", "dout")])
        w("if tid < 64:")
        for region, src in (("LS", "lse"), ("DD", "dsum")):
            at_row = f"{src}, b, {h}, min({i0} + tid, Tn - 1)"
            w(f"    cp_async4(sm, {at[region]} + tid, {at_row}, select({i0} + tid < Tn, 4, 0))")

    _stage(w, E, [(at["K"], "j0", "ko", "qkv"), (at["V"], "j0", "vo", "qkv")])
    issue_queries("i0", "h")
    w("cp_async_commit()")
    _zero(w, "dk", NJ)
    _zero(w, "dv", NJ)
    w("steps = rep * ((Tn - j0 + 63) // 64)  # (head, query tile) pairs")
    w("for step in range(steps):")
    w.level += 1
    w(f"qo = h * {E}", "cp_async_wait(0)", "cuda.syncthreads()")
    _zero(w, "s", 8)
    _product(w, "s", (at["K"], LD, "mk"), (at["Q"], LD, "mk"), E, 8, E, ks)
    _zero(w, "p", 8)
    _product(w, "p", (at["V"], LD, "mk"), (at["DO"], LD, "mk"), E, 8, E, ks)
    w("if j0 == i0:")
    w.level += 1
    _mask_diagonal(w, "s", rows_are_queries=False)
    w.level -= 1
    for j in range(8):
        w(f"lc{j} = sm[{at['LS']} + c{j}]", f"dc{j} = sm[{at['DD']} + c{j}]")
    for i in range(4):
        for j in range(8):
            w(f"s{i}_{j} = math.exp(s{i}_{j} * scale - lc{j})")
            w(f"p{i}_{j} = s{i}_{j} * (p{i}_{j} - dc{j})")
    _write_tile(w, at["PT"], "s")
    _write_tile(w, at["DS"], "p")
    w("cuda.syncthreads()")
    _product(w, "dv", (at["PT"], LDW, "mk"), (at["DO"], LD, "km"), 64, NJ, E, ks)
    _product(w, "dk", (at["DS"], LDW, "mk"), (at["Q"], LD, "km"), 64, NJ, E, ks)
    w("cuda.syncthreads()  # Q, dO, lse and D are read: the next pair's may land")
    w("i1 = i0 + 64", "wrap = i1 >= Tn", "i1 = select(wrap, j0, i1)", "h1 = h + select(wrap, 1, 0)")
    w("if step + 1 < steps:")
    w.level += 1
    issue_queries("i1", "h1")
    w.level -= 1
    w("cp_async_commit()")
    # dQ[query][e] += sum_key dS[query][key] K[key][e]: dS^T read "km", rows 4 ty + i
    _zero(w, "q", NJ)
    _product(w, "q", (at["DS"], LDW, "km"), (at["K"], LD, "km"), 64, NJ, E, ks)
    for i in range(4):
        w(f"if i0 + 4 * ty + {i} < Tn:")
        w.level += 1
        row = f"b, i0 + 4 * ty + {i}"
        if _run(E) == 4:
            for jq in range(NJ // 4):
                vals = ", ".join(f"q{i}_{4 * jq + t} * scale" for t in range(4))
                w(f"atomic_add4(dqkv, {row}, qo + e{4 * jq}, {vals})")
        else:
            w(*(f"cuda.atomic.add(dqkv, ({row}, qo + e{j}), q{i}_{j} * scale)" for j in range(NJ)))
        w.level -= 1
    w("i0 = i1", "h = h1")
    w.level -= 1
    for i in range(4):
        w(f"if j0 + r{i} < Tn:")
        w(*(f"    dqkv[b, j0 + r{i}, ko + e{j}] = dk{i}_{j} * scale" for j in range(NJ)))
        w(*(f"    dqkv[b, j0 + r{i}, vo + e{j}] = dv{i}_{j}" for j in range(NJ)))
    return w.text()


_BUILT: dict[tuple, tuple] = {}


HEADER = """import math

from numba import cuda, float32, uint64

from euler.gpu.async_copy import cp_async4, cp_async16, cp_async_commit, cp_async_wait
from euler.gpu.branchless import select
from euler.gpu.reduce import FULL_MASK, SIMULATOR
from euler.gpu.vector import atomic_add4, load4_shared
from euler.layer_math import online_softmax_rescale"""


def sources(E: int, options: TileOptions = TileOptions()) -> dict[str, str]:
    """The generated source of each kernel for head size E and options."""
    if not supports(E):
        raise ValueError(f"attention_exact_tiles: no tiled kernels for head size {E}")
    if E % options.kstep:
        raise ValueError(f"TileOptions.kstep: {options.kstep} does not divide head size {E}")
    return {
        "forward_tiled_kernel": _forward_source(E, options),
        "backward_dkv_tiled_kernel": _dkv_source(E, options),
    }


def kernels(E: int, options: TileOptions = TileOptions()) -> tuple:
    """(forward, dkv) dispatchers for head size E and options, built once for each."""
    key = (E, options)
    if key not in _BUILT:
        _BUILT[key] = tuple(compile_generated(n, s, HEADER) for n, s in sources(E, options).items())
    return _BUILT[key]


def attention_forward(out, lse, qkv, H: int, G: int, E: int, stream=0, options=TileOptions()):
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E), 16-byte aligned."""
    B, Tn, _ = qkv.shape
    check_aligned(qkv)
    args = (out, lse, qkv, H, G, qkv.dtype.type(1.0 / math.sqrt(E)))
    nbytes = shared_bytes(E)["forward"]
    grid = (B * H, (Tn + 63) // 64)
    attention.launch_dynamic(kernels(E, options)[0], grid, THREADS, stream, nbytes, *args)


def attention_backward(
    dqkv, dout, qkv, out, lse, H: int, G: int, E: int, dsum, stream=0, options=TileOptions()
):
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E), out and lse; dsum (B, H, T)
    scratch: backward_prep's D and zeroed dQ, then the dkv kernel (dQ by atomics)."""
    B, Tn, _ = qkv.shape
    check_aligned(qkv, dout)
    attention.backward_prep(dqkv, dsum, dout, out, H, E, stream)
    args = (dqkv, dsum, dout, qkv, lse, H, G, qkv.dtype.type(1.0 / math.sqrt(E)))
    nbytes = shared_bytes(E)["dkv"]
    grid = (B * G, (Tn + 63) // 64)
    attention.launch_dynamic(kernels(E, options)[1], grid, THREADS, stream, nbytes, *args)


def check(B: int, T: int, H: int, G: int, E: int) -> dict[str, float]:
    """Largest |difference| of out, lse and dqkv between these kernels and the readable ones
    (euler/gpu/attention.py) on random data; raises if one is over 1e-4."""
    from numba import cuda

    rng = np.random.default_rng(0)
    qkv = cuda.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
    dout = cuda.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
    got, want = {}, {}
    for name, fwd, bwd in (
        ("tiles", attention_forward, attention_backward),
        ("readable", attention.attention_forward, attention.attention_backward),
    ):
        out = cuda.to_device(np.zeros((B, T, H * E), np.float32))
        lse, dsum = (cuda.to_device(np.zeros((B, H, T), np.float32)) for _ in range(2))
        dqkv = cuda.to_device(np.full(qkv.shape, np.nan, np.float32))
        fwd(out, lse, qkv, H, G, E)
        bwd(dqkv, dout, qkv, out, lse, H, G, E, dsum)
        res = {"out": out, "lse": lse, "dqkv": dqkv}
        (got if name == "tiles" else want).update({k: v.copy_to_host() for k, v in res.items()})
    diffs = {k: float(np.abs(got[k] - want[k]).max()) for k in got}
    bad = {k: d for k, d in diffs.items() if not d <= 1e-4}
    if bad:
        raise SystemExit(f"attention_exact_tiles: differs from the readable kernels: {bad}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description="Check the tiled kernels against the readable.")
    ap.add_argument("--T", type=int, default=70, help="sequence length (70: two query tiles)")
    ap.add_argument("--head-size", type=int, default=8, choices=(8, 16, 32, 64))
    ap.add_argument("--heads", type=int, nargs=2, default=(2, 1), metavar=("H", "G"))
    args = ap.parse_args()
    H, G = args.heads
    diffs = check(1, args.T, H, G, args.head_size)
    print(f"attention_exact_tiles matches the readable kernels: largest differences {diffs}")


if __name__ == "__main__":
    main()
