"""Tensor-core matrix products for numba.cuda kernels: one warp-wide mma.sync.

numba.cuda exposes no tensor cores, so these functions emit the PTX instructions through
llvmlite inline assembly:

    mma_tf32     mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32    D = A B + C
                 (A 16 x 8, B 8 x 8, C and D 16 x 8, all float32 registers)
    mma_bf16     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   D = A B + C
                 (A 16 x 16, B 16 x 8 in bf16 pairs, one .b32 each; C, D float32)
    ldmatrix_x4, ldmatrix_x4_b16, ldmatrix_x4_trans_b16   four B (or A) fragments from a
                 shared tile in one instruction (rows must start on 16 bytes)
    tf32, tf32_operand, tf32_finite, pack_bf16x2, bf16x2_lo, bf16x2_hi   operand rounding

Every lane of a warp calls an mma with its own fragments; the product needs all 32 lanes
converged, so calls must sit outside lane-divergent branches. Fragments per lane (PTX ISA,
"Matrix Fragments for mma.m16n8k8" and "... m16n8k16 with floating point type"), with
g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group), as (row, column):

    m16n8k8 tf32:  A  a0 (g, t)   a1 (g + 8, t)   a2 (g, t + 4)   a3 (g + 8, t + 4)
                   B  b0 (k = t, n = g)   b1 (k = t + 4, n = g)
    m16n8k16 bf16: A  a0 (g, 2t..2t+1)   a1 (g + 8, 2t..2t+1)
                      a2 (g, 2t+8..2t+9) a3 (g + 8, 2t+8..2t+9)
                   B  b0 (k = 2t..2t+1, n = g)   b1 (k = 2t+8..2t+9, n = g)
    both:          C, D  c0 (g, 2t)   c1 (g, 2t + 1)   c2 (g + 8, 2t)   c3 (g + 8, 2t + 1)

A bf16 pair holds the lower-numbered column (of A) or k (of B) in its low 16 bits. So the
C fragments of two adjacent 8-column blocks, packed in pairs, are the A fragment of the
next product's 16 columns: FlashAttention-2 keeps P in registers this way.

The CUDA simulator (NUMBA_ENABLE_CUDASIM=1) cannot run inline assembly, so there the same
functions, picked at import, emulate the instructions: each lane puts its fragments (or
its ldmatrix address) in block-shared scratch, a barrier, each lane computes its outputs
from the whole warp's, a barrier. The simulator has no warp barrier, so every thread of
the block must make the same sequence of calls (the kernels here do). The emulated
products read only the TF32 (bf16) part of each operand, form the exact products and
round their sum with C once to float32; the hardware's summation order is unspecified,
so the two agree to float32 rounding of the sum, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR  # read at import, as numba.cuda is chosen (reduce.py)

TF32_MASK = 0xFFFFE000  # the bits of a float32 that a TF32 value keeps
HALF_TF32_UNIT = 0x1000  # added to the bits, then truncated: round to nearest, ties away
LDMATRIX_PTX = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
MMA_PTX = (
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)
MMA_BF16_PTX = MMA_PTX.replace("m16n8k8", "m16n8k16").replace("tf32.tf32", "bf16.bf16")
LDMATRIX_TRANS_PTX = LDMATRIX_PTX.replace(".x4.", ".x4.trans.")


def tf32_round_host(x: np.ndarray) -> np.ndarray:
    """x (any shape) rounded to TF32 as cvt.rna.tf32.f32 does, as float32 (NumPy, host)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(HALF_TF32_UNIT)) & np.uint32(TF32_MASK)).view(np.float32)


if not SIMULATOR:
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr, shared_address

    @intrinsic
    def tf32(typingctx, x):
        """x (float32) rounded to TF32 (cvt.rna.tf32.f32), returned as a float32."""
        if x != types.float32:
            raise TypingError(f"tf32 takes a float32, not {x}")

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            cvt = ir.InlineAsm(ir.FunctionType(i32, [f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.bitcast(builder.call(cvt, [args[0]]), f32)

        return types.float32(types.float32), codegen

    def _half_unit_added(builder, x):
        """x's bits plus 0x1000, as an i32 (llvmlite)."""
        i32 = ir.IntType(32)
        return builder.add(builder.bitcast(x, i32), ir.Constant(i32, HALF_TF32_UNIT))

    @intrinsic
    def tf32_operand(typingctx, x):
        """x (float32) as an mma_tf32 operand rounded to TF32: its bits plus 0x1000, the
        low 13 bits left for the tensor core to ignore (not a rounded float32 itself).

        The same operand as tf32(x) for every finite x and for inf (inf + 0x1000 truncates
        back to inf); only a NaN whose payload lies in the low 13 bits enters as inf. One
        integer add, where ptxas compiles a cvt.rna feeding an mma to that add behind a
        test for inf and NaN (docs/gpu.md)."""
        if x != types.float32:
            raise TypingError(f"tf32_operand takes a float32, not {x}")

        def codegen(context, builder, sig, args):
            return builder.bitcast(_half_unit_added(builder, args[0]), ir.FloatType())

        return types.float32(types.float32), codegen

    @intrinsic
    def tf32_finite(typingctx, x):
        """x (a finite float32) rounded to TF32 as tf32 rounds it: (bits + 0x1000) with the
        low 13 bits cleared, two integer instructions and no test for inf and NaN (for the
        softmax's probabilities, which are summed as well as multiplied)."""
        if x != types.float32:
            raise TypingError(f"tf32_finite takes a float32, not {x}")

        def codegen(context, builder, sig, args):
            mask = ir.Constant(ir.IntType(32), TF32_MASK)
            return builder.bitcast(builder.and_(_half_unit_added(builder, args[0]), mask),
                                   ir.FloatType())  # fmt: skip

        return types.float32(types.float32), codegen

    @intrinsic
    def ldmatrix_x4(typingctx, sm, i):
        """(r0, r1, r2, r3) (float32): word t of row g of each of four 8 x 4-word matrices
        of the shared array sm, this lane giving sm[i] as row lane % 8 of matrix lane // 8.

        ldmatrix.sync.aligned.m8n8.x4.shared.b16 moves 8 x 8 matrices of 16-bit values,
        which are 8 rows of 4 words for 32-bit data: from an [n][k] tile, b0 of an 8 x 8
        block whose row n starts at the address, or b1 if the address is 4 words on. One
        instruction replaces four 32-bit shared loads."""
        ok = isinstance(sm, types.Array) and sm.ndim == 1 and sm.dtype == types.float32
        if not ok or not isinstance(i, types.Integer):
            raise TypingError("ldmatrix_x4 takes a 1-d float32 shared array and an index")
        sig = types.UniTuple(types.float32, 4)(sm, i)

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            p = element_ptr(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
            shared = shared_address(builder, p)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            # volatile and a memory clobber: warp-collective, and it reads what other
            # threads stored before a barrier
            asm = ir.InlineAsm(fnty, LDMATRIX_PTX, "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            res = builder.call(asm, [shared])
            d = [builder.bitcast(builder.extract_value(res, k), f32) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, d)

        return sig, codegen

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3) = this lane's D fragment of A B + C (all float32; layout above)."""
        args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        if any(a != types.float32 for a in args):
            raise TypingError(f"mma_tf32 takes ten float32 fragments, not {args}")
        sig = types.UniTuple(types.float32, 4)(*args)

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            constraints = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)
            # volatile, like CUTLASS's asm volatile: LLVM must not move a warp-collective
            # instruction into a branch or drop it
            asm = ir.InlineAsm(fnty, MMA_PTX, constraints, side_effect=True)
            ab = [builder.bitcast(v, i32) for v in args[:6]]
            res = builder.call(asm, ab + list(args[6:]))
            d = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, d)

        return sig, codegen

    @intrinsic
    def pack_bf16x2(typingctx, lo, hi):
        """lo, hi (float32) rounded to bf16 (nearest even) in one .b32 (uint32), lo in the
        low half: cvt.rn.bf16x2.f32, whose first source goes to the high half (a NaN
        becomes 0x7FFF, where layer_math.bf16_round gives 0x7FC0)."""
        if lo != types.float32 or hi != types.float32:
            raise TypingError(f"pack_bf16x2 takes two float32, not {lo}, {hi}")

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            cvt = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;",
                               "=r,f,f")  # fmt: skip
            return builder.call(cvt, [args[1], args[0]])

        return types.uint32(types.float32, types.float32), codegen

    def _widen_half(high: bool):
        def widen(typingctx, w):
            if w != types.uint32:
                raise TypingError(f"bf16x2 halves come from a uint32, not {w}")

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                if high:
                    bits = builder.and_(args[0], ir.Constant(i32, 0xFFFF0000))
                else:
                    bits = builder.shl(args[0], ir.Constant(i32, 16))
                return builder.bitcast(bits, ir.FloatType())

            return types.float32(types.uint32), codegen

        widen.__name__ = widen.__qualname__ = f"bf16x2_{'hi' if high else 'lo'}"
        widen.__doc__ = f"The {'high' if high else 'low'} bf16 of a .b32 pair, as a float32."
        return intrinsic(widen)

    bf16x2_lo = _widen_half(high=False)
    bf16x2_hi = _widen_half(high=True)

    def _ldmatrix_b16(ptx: str):
        def load(typingctx, sm, i):
            ok = isinstance(sm, types.Array) and sm.ndim == 1 and sm.dtype == types.uint16
            if not ok or not isinstance(i, types.Integer):
                raise TypingError("ldmatrix of bf16 takes a 1-d uint16 shared array and an index")
            sig = types.UniTuple(types.uint32, 4)(sm, i)

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                p = element_ptr(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
                fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
                # volatile and a memory clobber, as ldmatrix_x4
                asm = ir.InlineAsm(fnty, ptx, "=r,=r,=r,=r,r,~{memory}", side_effect=True)
                res = builder.call(asm, [shared_address(builder, p)])
                d = [builder.extract_value(res, k) for k in range(4)]
                return context.make_tuple(builder, sig.return_type, d)

            return sig, codegen

        return load

    def ldmatrix_x4_b16(typingctx, sm, i):
        """(r0, r1, r2, r3) (uint32): elements 2t, 2t + 1 of row g of each of four 8 x 8
        bf16 matrices of the shared uint16 array sm, this lane giving sm[i] as row lane % 8
        of matrix lane // 8: an A fragment of a [row][k] tile, a B fragment of an [n][k]
        one."""
        return _ldmatrix_b16(LDMATRIX_PTX)(typingctx, sm, i)

    def ldmatrix_x4_trans_b16(typingctx, sm, i):
        """ldmatrix_x4_b16 with .trans: elements (2t, g) and (2t + 1, g) of each matrix (a B
        fragment of a [k][n] tile)."""
        return _ldmatrix_b16(LDMATRIX_TRANS_PTX)(typingctx, sm, i)

    ldmatrix_x4_b16 = intrinsic(ldmatrix_x4_b16)
    ldmatrix_x4_trans_b16 = intrinsic(ldmatrix_x4_trans_b16)

    @intrinsic
    def mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3) (float32) = this lane's D fragment of A B + C, A and B in bf16
        pairs (uint32), C float32 (m16n8k16 layout above)."""
        args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        if any(a != types.uint32 for a in args[:6]) or any(c != types.float32 for c in args[6:]):
            raise TypingError(f"mma_bf16 takes six uint32 and four float32 fragments, not {args}")
        sig = types.UniTuple(types.float32, 4)(*args)

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            constraints = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)
            asm = ir.InlineAsm(fnty, MMA_BF16_PTX, constraints, side_effect=True)  # as mma_tf32
            res = builder.call(asm, list(args))
            d = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, d)

        return sig, codegen

else:
    _MAX_THREADS = 1024

    def _tf32_bits(x) -> np.uint32:
        return np.array(x, dtype=np.float32).view(np.uint32)[()]

    @cuda.jit(device=True)
    def tf32(x):
        """x rounded to TF32 (ties away from zero), as a float32: the simulator's cvt.rna."""
        bits = (_tf32_bits(x) + np.uint32(HALF_TF32_UNIT)) & np.uint32(TF32_MASK)
        return np.array(bits, dtype=np.uint32).view(np.float32)[()]

    @cuda.jit(device=True)
    def tf32_finite(x):
        """The simulator's tf32_finite: tf32."""
        return tf32(x)

    @cuda.jit(device=True)
    def tf32_operand(x):
        """The simulator's tf32_operand: the bits plus 0x1000, unmasked (its mma_tf32 reads
        only the TF32 bits, as the hardware does)."""
        bits = _tf32_bits(x) + np.uint32(HALF_TF32_UNIT)
        return np.array(bits, dtype=np.uint32).view(np.float32)[()]

    @cuda.jit(device=True)
    def ldmatrix_x4(sm, i):
        """The simulator's ldmatrix_x4: the warp's row addresses meet in shared scratch."""
        rows = cuda.shared.array(_MAX_THREADS, np.int64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z
        )
        rows[tid] = i
        cuda.syncthreads()
        warp, g, t = tid - tid % 32, (tid % 32) // 4, tid % 4
        r = (sm[rows[warp + g] + t], sm[rows[warp + 8 + g] + t], sm[rows[warp + 16 + g] + t],
             sm[rows[warp + 24 + g] + t])  # fmt: skip
        cuda.syncthreads()
        return r[0], r[1], r[2], r[3]

    @cuda.jit(device=True)
    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """The simulator's warp-wide m16n8k8 TF32 product (see the module docstring)."""
        frag = cuda.shared.array((_MAX_THREADS, 6), np.float64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z
        )
        for i, v in enumerate((a0, a1, a2, a3, b0, b1)):
            bits = _tf32_bits(v) & np.uint32(TF32_MASK)  # the hardware reads only these bits
            frag[tid, i] = np.array(bits, dtype=np.uint32).view(np.float32)[()]
        cuda.syncthreads()
        warp = tid - tid % 32
        g, t = (tid % 32) // 4, tid % 4

        def a(row, k):  # A[row][k], from the lane that holds it
            return frag[warp + 4 * (row % 8) + k % 4, (row // 8) + 2 * (k // 4)]

        def b(k, n):  # B[k][n]
            return frag[warp + 4 * n + k % 4, 4 + k // 4]

        d = []
        for row, col, c in (
            (g, 2 * t, c0),
            (g, 2 * t + 1, c1),
            (g + 8, 2 * t, c2),
            (g + 8, 2 * t + 1, c3),
        ):
            # the products of TF32 values are exact in float64; the sum is rounded once
            d.append(np.float32(float(c) + sum(a(row, k) * b(k, col) for k in range(8))))
        cuda.syncthreads()
        return d[0], d[1], d[2], d[3]

    def _bf16_of(x) -> np.uint32:
        """The bf16 bits of float32 x, nearest even (euler.precision.to_bf16's rounding)."""
        u = int(np.array(x, dtype=np.float32).view(np.uint32)[()])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return np.uint32(0x7FC0)
        return np.uint32(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)

    @cuda.jit(device=True)
    def pack_bf16x2(lo, hi):
        """The simulator's cvt.rn.bf16x2.f32: two bf16, lo in the low half."""
        return np.uint32(_bf16_of(lo) | (_bf16_of(hi) << np.uint32(16)))

    def _f32_of_bits(bits) -> np.float32:
        return np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()]

    @cuda.jit(device=True)
    def bf16x2_lo(w):
        """The low bf16 of a .b32 pair, as a float32."""
        return _f32_of_bits(int(w) << 16)

    @cuda.jit(device=True)
    def bf16x2_hi(w):
        """The high bf16 of a .b32 pair, as a float32."""
        return _f32_of_bits(int(w) & 0xFFFF0000)

    def _ldmatrix_b16_sim(sm, i, trans: bool):
        rows = cuda.shared.array(_MAX_THREADS, np.int64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z
        )
        rows[tid] = i
        cuda.syncthreads()
        warp, g, t = tid - tid % 32, (tid % 32) // 4, tid % 4
        r = []
        for m in range(4):
            if trans:  # elements (2t, g), (2t + 1, g)
                lo, hi = sm[rows[warp + 8 * m + 2 * t] + g], sm[rows[warp + 8 * m + 2 * t + 1] + g]
            else:  # elements (g, 2t), (g, 2t + 1)
                lo, hi = sm[rows[warp + 8 * m + g] + 2 * t], sm[rows[warp + 8 * m + g] + 2 * t + 1]
            r.append(np.uint32(int(lo) | (int(hi) << 16)))
        cuda.syncthreads()
        return r[0], r[1], r[2], r[3]

    @cuda.jit(device=True)
    def ldmatrix_x4_b16(sm, i):
        """The simulator's ldmatrix_x4_b16: the warp's row addresses meet in shared scratch."""
        return _ldmatrix_b16_sim(sm, i, trans=False)

    @cuda.jit(device=True)
    def ldmatrix_x4_trans_b16(sm, i):
        """The simulator's ldmatrix_x4_trans_b16."""
        return _ldmatrix_b16_sim(sm, i, trans=True)

    def _pairs(words) -> np.ndarray:
        """(..., 2) float64: the low and high bf16 of each uint32 of words."""
        w = np.asarray(words, dtype=np.uint32)
        halves = np.stack([w << np.uint32(16), w & np.uint32(0xFFFF0000)], axis=-1)
        return halves.view(np.float32).astype(np.float64)

    @cuda.jit(device=True)
    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """The simulator's warp-wide m16n8k16 bf16 product (see the module docstring): the
        products of bf16 values (8-bit significands) are exact in float64, and so is their
        sum unless the 16 terms span more than about 37 binades."""
        frag = cuda.shared.array((_MAX_THREADS, 6), np.uint32)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z
        )
        for i, v in enumerate((a0, a1, a2, a3, b0, b1)):
            frag[tid, i] = v
        cuda.syncthreads()
        fr = frag[tid - tid % 32 : tid - tid % 32 + 32]
        g, t = (tid % 32) // 4, tid % 4
        # row r of A lies in lanes 4 (r % 8) + t' (registers r // 8 for k < 8, r // 8 + 2
        # past), column n of B in lanes 4 n + t' (registers 4, 5): both ordered
        # (t', k // 8, k % 2) with k = 8 (k // 8) + 2 t' + k % 2
        rows = np.stack([_pairs(fr[4 * g : 4 * g + 4, [h, h + 2]]).ravel() for h in (0, 1)])
        cols = np.stack([_pairs(fr[4 * n : 4 * n + 4, 4:6]).ravel() for n in (2 * t, 2 * t + 1)])
        d = rows @ cols.T + np.array([[c0, c1], [c2, c3]], dtype=np.float64)
        cuda.syncthreads()
        return np.float32(d[0, 0]), np.float32(d[0, 1]), np.float32(d[1, 0]), np.float32(d[1, 1])
