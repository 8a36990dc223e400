"""Matrix products on the CPU: OpenBLAS's one-thread kernels, called from prange blocks.

Every parallel loop of the CPU backend runs on Numba's one pool of threads, products
included: a product is cut into blocks, a prange hands the blocks to the threads, and each
block is one call of the sgemm (dgemm for float64) of NumPy's own OpenBLAS, told to run
single-threaded (a second pool on the same cores would fight this one for them).

Every result bit is the same at 1 or 16 threads, although the cut follows the thread count:

- A sum is cut by the shapes alone. A weight gradient out (M, N) = A^T B (a sum over the
  batch's tokens) with a small output cuts its sum into up to `pieces` pieces, to give
  the threads work; each piece but the first sums into a partial buffer, and the partials
  are then added into out in their order. A sum cut elsewhere adds in another order.
- Rows and columns are cut by the thread count: about `per_thread` blocks a thread (two:
  a thread that finishes first takes another), and one block a thread from `many_threads`
  threads on, each block of at least `block_macs` multiply-adds, with edges on multiples
  of `align` rows or columns. Many threads make small blocks, and every block repacks its
  slice of the other operand: on the lent 16-core Xeon (OpenBLAS's AVX-512 kernels) the
  `small` step at 4 threads took 64.6 ms with one block a thread against 69.9 with two; at
  2 threads one block was faster there too (116.9 against 124.8 ms) but 8% slower on the
  2-core Zen 4 machine (98.8 against 91.2 ms, every round; why is not known), so two stay
  below 4 threads (bench/labs/cpu_plans.py, docs/measurements.md).
  Such a block computes each of its elements as the whole product's call would, the same
  kernel summing the same terms in the same order: OpenBLAS picks its kernel by a call's
  sizes, and only calls of a few rows (a one-row call is a gemv) or of edges inside its
  register tiles differ from the whole (bench/labs/cpu_product_bits.py checks this CPU).
  That holds for OpenBLAS's AVX-512 kernels (TILE_EXACT_FAMILIES), not for its Haswell
  ones (every AVX2 CPU's): there a block's last rows differ from the whole product's, so
  default_plan() cuts every product as for the machine's core count at every thread
  count, one thread included (on the 2-core machine that cost nothing; as for 16, a step
  at 2 threads took 13% longer).
- One thread computes a product whole, in one call: cutting it buys nothing there, and every
  block repacks its slice of the other operand.

The threads take blocks as they finish the last (dynamic scheduling): blocks differ in cost,
and a backward's two products of a layer share one parallel loop.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import dataclass

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import njit, prange, types

from euler import blas_kernels
from euler.blas_kernels import core_name, cpu_flags, kernel_warning, openblas, symbol

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _bind() -> ctypes.CDLL:
    """Give sgemm and dgemm names that compiled kernels link against. The names are resolved
    when a kernel is linked, also one loaded from Numba's cache, so this runs when the
    module is imported, before any kernel."""
    lib = openblas()
    for ours, names in (("euler_sgemm", blas_kernels.SGEMM), ("euler_dgemm", blas_kernels.DGEMM)):
        fn = getattr(lib, symbol(lib, names))
        llvm.add_symbol(ours, ctypes.cast(fn, ctypes.c_void_p).value)
    return lib


_OPENBLAS = _bind()


def set_blas_threads(n: int) -> None:
    """OpenBLAS's threads per call: 1 for the backend, whose blocks run on Numba's threads
    (set when this module is imported); a lab sets more to time OpenBLAS's own threading."""
    getattr(_OPENBLAS, symbol(_OPENBLAS, blas_kernels.SET_THREADS))(ctypes.c_int(n))


set_blas_threads(1)


_KERNEL_WARNING = kernel_warning(core_name(), cpu_flags(), os.environ.get("OPENBLAS_CORETYPE", ""))
if _KERNEL_WARNING:
    warnings.warn(_KERNEL_WARNING, stacklevel=1)


def _gemm_type(real):
    # cblas_?gemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) with
    # pointers passed as 64-bit integers (the same registers and stack slots on x86-64)
    i32, i64 = types.int32, types.int64
    return types.void(i32, i32, i32, i64, i64, i64, real, i64, i64, i64, i64, real, i64, i64)


_sgemm = types.ExternalFunction("euler_sgemm", _gemm_type(types.float32))
_dgemm = types.ExternalFunction("euler_dgemm", _gemm_type(types.float64))


@dataclass(frozen=True)
class ProductPlan:
    """How products are cut into blocks and the blocks scheduled (see the module's text)."""

    per_thread: int = 2  # row x column blocks a thread, about, on 2 to many_threads - 1
    pair_per_thread: int = 0  # the same for each product of a pair (0: per_thread)
    many_threads: int = 4  # from this many threads on, one block a thread
    block_macs: int = 1 << 20  # fewest multiply-adds in a block
    align: int = 64  # row and column blocks start on multiples of this
    pieces: int = 4  # most pieces a weight gradient's sum is cut into
    piece_min: int = 256  # fewest terms in a piece
    piece_blocks: int = 16  # a sum is cut while its blocks would be fewer than this
    small_output: int = 1 << 18  # weight gradients with fewer output elements cut their sums
    dynamic: bool = True  # threads take blocks one at a time as they finish (else: in turn)
    cut_as_for: int = 0  # cut as for this many threads at every count (0: the count itself)

    def sum_pieces(self, M: int, N: int, K: int, trans_a: bool) -> int:
        """Pieces the K-term sum of out (M, N) = op(a) @ op(b) is cut into, by its shape
        alone (a piece's partial sum changes the order of the additions): a weight gradient
        (trans_a) with a small output, in pieces of at least piece_min terms."""
        if not trans_a or M * N >= self.small_output:
            return 1
        count = max(1, min(self.piece_blocks, M * N * K // self.block_macs))
        return max(1, min(self.pieces, count, K // self.piece_min))

    def cut(
        self, M: int, N: int, K: int, trans_a: bool, threads: int, paired: bool = False
    ) -> tuple[int, int, int]:
        """(row blocks, column blocks, sum pieces) for out (M, N) = op(a) @ op(b), K terms,
        on `threads` threads, alone or one of a pair run in one parallel loop.

        The sum's pieces count as blocks; the rest form the grid of rows x columns that
        packs the fewest elements: BLAS copies the (K, N/nb) of b and the (M/mb, K) of a
        that a block reads, so rows x columns blocks copy mb K N + nb M K elements.
        """
        pieces = self.sum_pieces(M, N, K, trans_a)
        threads = self.cut_as_for or threads
        per_thread = (self.pair_per_thread or self.per_thread) if paired else self.per_thread
        per_thread = per_thread if threads < self.many_threads else 1
        wanted = -(-threads * per_thread // pieces) if threads > 1 else 1
        count = max(1, min(wanted, M * N * K // pieces // self.block_macs))
        rows, cols = max(1, M // self.align), max(1, N // self.align)
        grids = [(mb, c // mb) for c in range(count, 0, -1) for mb in range(1, c + 1)
                 if c % mb == 0 and mb <= rows and c // mb <= cols]  # fmt: skip
        most = grids[0][0] * grids[0][1]
        mb, nb = min((g for g in grids if g[0] * g[1] == most),
                     key=lambda g: (g[0] * K * N + g[1] * M * K, -g[0]))  # fmt: skip
        return mb, nb, pieces


# OpenBLAS's kernel families that compute an element alike wherever a block's edges put it
# in their register tiles (bench/labs/cpu_product_bits.py found no cut that differed on a
# Zen 4 or a Sapphire Rapids). Haswell's kernels compute a tile's last rows otherwise
# (a block's last four rows differ from the whole product's), so under it, or any family
# not named here, the cut must not follow the thread count.
TILE_EXACT_FAMILIES = frozenset({"SkylakeX"})


def default_plan() -> ProductPlan:
    """ProductPlan() where OpenBLAS's kernel family keeps a block's bits; elsewhere the cut
    of this machine's core count at every thread count (the same blocks at 1 thread)."""
    if core_name() in TILE_EXACT_FAMILIES:
        return ProductPlan()
    return ProductPlan(cut_as_for=os.cpu_count() or 1)


@njit(nogil=True, cache=True)
def gemm(m, n, k, pa, lda, pb, ldb, beta, pc, ldc, double, trans_a=False, trans_b=False):
    """C (m, n) = op(A) op(B) + beta C on one thread, at raw addresses pa, pb, pc (row-major,
    leading dimensions in elements); float64 if double, else float32; op transposes where
    trans_a, trans_b say."""
    ta = _TRANS if trans_a else _NO_TRANS
    tb = _TRANS if trans_b else _NO_TRANS
    if double:
        _dgemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, beta, pc, ldc)
    else:
        _sgemm(_ROW_MAJOR, ta, tb, m, n, k, np.float32(1.0), pa, lda, pb, ldb,
               np.float32(beta), pc, ldc)  # fmt: skip


@njit(nogil=True, cache=True)
def _edge(i, n, parts, align):
    """Where block i of n rows (or columns) cut into parts starts: on a multiple of align."""
    return n if i == parts else i * n // parts // align * align


@njit(nogil=True, cache=True)
def _block(out, ldo, pa, lda, pb, ldb, K, trans_a, trans_b, beta, mb, nb, kb, partial, align, i):
    """Block i of out = op(A) @ op(B) cut into mb x nb x kb: its rows, columns, sum piece.
    A and B are addresses and leading dimensions, ldo out's (_address), K the sum's terms."""
    M, N = out.shape
    r, c, k = i % mb, (i // mb) % nb, i // (mb * nb)
    r0, r1 = _edge(r, M, mb, align), _edge(r + 1, M, mb, align)
    c0, c1 = _edge(c, N, nb, align), _edge(c + 1, N, nb, align)
    k0, k1 = k * K // kb, (k + 1) * K // kb
    dst = out if k == 0 else partial[k - 1]
    item = out.itemsize
    ldc = ldo if k == 0 else N  # the partials are whole (M, N) arrays
    gemm(r1 - r0, c1 - c0, k1 - k0,
         pa + item * (k0 * lda + r0 if trans_a else r0 * lda + k0), lda,
         pb + item * (c0 * ldb + k0 if trans_b else k0 * ldb + c0), ldb,
         beta if k == 0 else 0.0, dst.ctypes.data + item * (r0 * ldc + c0), ldc,
         item == 8, trans_a=trans_a, trans_b=trans_b)  # fmt: skip


@njit(nogil=True, cache=True)
def _add_partials(out, partial, pieces, r):
    """out[r] += partial[0, r] + ... + partial[pieces - 2, r], in that order."""
    row = out[r]
    for p in range(pieces - 1):
        part = partial[p, r]
        for j in range(row.shape[0]):
            row[j] += part[j]


@njit(parallel=True, nogil=True, cache=True)
def _products(o1, ldo1, pa1, lda1, pb1, ldb1, K1, ta1, tb1, beta1, m1, n1, k1, p1,
              o2, ldo2, pa2, lda2, pb2, ldb2, K2, ta2, tb2, beta2, m2, n2, k2, p2,
              align):  # fmt: skip
    """Two products' blocks in one parallel loop (m x n x k blocks each; m2 = 0 for one
    product), then their partial sums. The operands are addresses, so that one compiled
    kernel serves arrays and views alike."""
    first = m1 * n1 * k1
    for i in prange(first + m2 * n2 * k2):
        # a signed index in both calls: prange's own is unsigned, and each index type
        # would compile a callee of its own
        j = np.int64(i)
        if j < first:
            _block(o1, ldo1, pa1, lda1, pb1, ldb1, K1, ta1, tb1, beta1, m1, n1, k1, p1, align, j)
        else:
            _block(o2, ldo2, pa2, lda2, pb2, ldb2, K2, ta2, tb2, beta2, m2, n2, k2, p2, align,
                   j - first)  # fmt: skip
    rows1 = o1.shape[0] if k1 > 1 else 0
    rows2 = o2.shape[0] if k2 > 1 and m2 > 0 else 0
    for r in prange(rows1 + rows2):
        row = np.int64(r)
        if row < rows1:
            _add_partials(o1, p1, k1, row)
        else:
            _add_partials(o2, p2, k2, row - rows1)


def _address(x: np.ndarray) -> tuple[int, int]:
    """(address, leading dimension in elements) of a 2-D array whose rows are contiguous:
    at least a row's length, as BLAS asks, for a single row."""
    ld = x.strides[0] // x.itemsize if x.shape[0] > 1 else max(x.shape[1], 1)
    return x.ctypes.data, ld


class Products:
    """The CPU backend's matrix products: each planned, its partial sums in kept scratch."""

    def __init__(self, plan: ProductPlan | None = None):
        self.plan = plan or default_plan()
        self._partials: dict[tuple, np.ndarray] = {}
        self._cuts: dict[tuple, tuple[int, int, int]] = {}  # a step repeats its shapes

    def _prepare(self, out, a, b, trans_a, trans_b, accumulate, paired=False) -> tuple:
        """The arguments of one product for _products, after checking what BLAS trusts, and
        the operands they point into (the caller holds them until the kernel returns)."""
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        if (b.shape[1] if trans_b else b.shape[0]) != K or (
            a.shape[1] if trans_a else a.shape[0]
        ) != M:
            raise ValueError(f"matmul: shapes {a.shape}, {b.shape} do not give {out.shape}")
        if not (out.dtype == a.dtype == b.dtype) or out.dtype not in (np.float32, np.float64):
            raise ValueError(f"matmul: expected one float32 or float64 dtype, got "
                             f"{out.dtype}, {a.dtype}, {b.dtype}")  # fmt: skip
        if out.size and out.strides[1] != out.itemsize:
            raise ValueError("matmul: out's rows must be contiguous")
        a = a if a.strides[1] == a.itemsize or not a.size else np.ascontiguousarray(a)
        b = b if b.strides[1] == b.itemsize or not b.size else np.ascontiguousarray(b)
        shape = (M, N, K, trans_a, numba.get_num_threads(), paired)
        if shape not in self._cuts:
            self._cuts[shape] = self.plan.cut(*shape) if M * N else (0, 1, 1)
        mb, nb, pieces = self._cuts[shape]
        # pieces 1 reads no partials: a one-element stand-in of the dtype the kernel expects
        key = (pieces - 1, M, N, out.dtype.str) if pieces > 1 else (0, out.dtype.str)
        partial = self._partials.get(key)
        if partial is None:
            dims = (pieces - 1, M, N) if pieces > 1 else (1, 1, 1)
            partial = self._partials[key] = np.empty(dims, out.dtype)
        beta = 1.0 if accumulate else 0.0
        args = (out, _address(out)[1], *_address(a), *_address(b), K, trans_a, trans_b, beta,
                mb, nb, pieces, partial)  # fmt: skip
        return args, (a, b)  # the kernel gets a and b (copies, maybe) as addresses: keep them

    def __call__(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=); op an optional transpose."""
        first, _operands = self._prepare(out, a, b, trans_a, trans_b, accumulate)
        self._run(first, (*first[:10], 0, 1, 1, first[13]))

    def pair(self, first, second) -> None:
        """Two independent products, each (out, a, b, trans_a, trans_b, accumulate), in one
        parallel loop over both products' blocks (a backward's dX and dW of one layer)."""
        (one, _operands1), (two, _operands2) = (
            self._prepare(*p, paired=True) for p in (first, second)
        )
        self._run(one, two)

    def _run(self, first, second) -> None:
        # a chunk size of 1 makes the prange hand out blocks one at a time
        before = numba.set_parallel_chunksize(1 if self.plan.dynamic else 0)
        try:
            _products(*first, *second, self.plan.align)
        finally:
            numba.set_parallel_chunksize(before)
