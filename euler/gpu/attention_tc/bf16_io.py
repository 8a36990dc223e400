"""The bf16 attention's memory operations on uint16 arrays of bf16 bits (euler.precision).

async_copy's and vector.py's intrinsics take float32 arrays; these are their bf16 forms,
moving bf16 as 16-byte blocks of 8 and 32-bit words of 2 (the packed pairs of mma.py):

    cp_async16_bf16(sh, i, src, i0, i1, i2, n)   cp.async 16 bytes: src[i0, i1, i2 : i2 + 8]
                                                 to sh[i : i + 8], n bytes read, zeros after
    cp_async16_bf16_flat(sh, i, src, k)          the same from src's element k in C order
    w0, w1, w2, w3 = load_words4_shared(sh, i)   sh[i : i + 8] as four .b32 (ld.shared.v4)
    store_words4_3d(dst, i0, i1, i2, w0, .., w3) dst[i0, i1, i2 : i2 + 8] (st.global.v4)
    store_word_shared(sh, i, w)                  sh[i : i + 2] = w (i even, st.shared.b32)

sh is a 1-d uint16 shared array, src and dst 3-d uint16 arrays; i, i2 and k are element
indices, multiples of 8 (of 2 for store_word_shared) on 16-byte aligned data. In the CUDA
simulator they are element loops (the copies synchronous, as async_copy's).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR


def _u16(a, ndim: int) -> bool:
    return isinstance(a, types.Array) and a.ndim == ndim and a.dtype == types.uint16


if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr, flat_ptr, shared_address

    _I32 = ir.IntType(32)
    _V4 = ir.VectorType(_I32, 4)

    def _copy(builder, dst, src, nbytes=None) -> None:
        """cp.async.cg of 16 bytes from the global pointer src to the shared one dst."""
        more = "" if nbytes is None else ", $2"
        types_ = [_I32, ir.IntType(64)] + ([_I32] if nbytes is not None else [])
        fnty = ir.FunctionType(ir.VoidType(), types_)
        constraints = "r,l" + (",r" if nbytes is not None else "") + ",~{memory}"
        asm = ir.InlineAsm(fnty, f"cp.async.cg.shared.global [$0], [$1], 16{more};", constraints,
                           side_effect=True)  # fmt: skip
        args = [shared_address(builder, dst), builder.ptrtoint(src, ir.IntType(64))]
        builder.call(asm, args + ([nbytes] if nbytes is not None else []))

    @intrinsic
    def cp_async16_bf16(typingctx, sh, i, src, i0, i1, i2, n):
        """cp.async of src[i0, i1, i2 : i2 + 8] to sh[i : i + 8], n of its 16 bytes read."""
        if not (_u16(sh, 1) and _u16(src, 3)):
            raise TypingError("cp_async16_bf16 takes a 1-d and a 3-d uint16 array")

        def codegen(context, builder, sig, args):
            t = sig.args
            d = element_ptr(context, builder, t[0], args[0], [args[1]], [t[1]])
            s = element_ptr(context, builder, t[2], args[2], args[3:6], t[3:6])
            _copy(builder, d, s, context.cast(builder, args[6], t[6], types.int32))
            return context.get_dummy_value()

        return types.void(sh, i, src, i0, i1, i2, n), codegen

    @intrinsic
    def cp_async16_bf16_flat(typingctx, sh, i, src, k):
        """cp.async of src's elements k .. k + 7 (C order) to sh[i : i + 8]."""
        if not (_u16(sh, 1) and isinstance(src, types.Array) and src.dtype == types.uint16):
            raise TypingError("cp_async16_bf16_flat takes a 1-d and a C-contiguous uint16 array")

        def codegen(context, builder, sig, args):
            t = sig.args
            d = element_ptr(context, builder, t[0], args[0], [args[1]], [t[1]])
            _copy(builder, d, flat_ptr(context, builder, t[2], args[2], args[3], t[3]))
            return context.get_dummy_value()

        return types.void(sh, i, src, k), codegen

    def _pointer(context, builder, sig, args, n: int, space: int, pointee):
        p = element_ptr(
            context, builder, sig.args[0], args[0], args[1 : 1 + n], sig.args[1 : 1 + n]
        )
        p = builder.addrspacecast(p, ir.PointerType(p.type.pointee, space))
        return builder.bitcast(p, ir.PointerType(pointee, space))

    @intrinsic
    def load_words4_shared(typingctx, sh, i):
        """sh[i : i + 8] as four uint32 (bf16 pairs), one 16-byte shared load."""
        if not _u16(sh, 1):
            raise TypingError("load_words4_shared takes a 1-d uint16 shared array")
        ret = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            vec = builder.load(_pointer(context, builder, sig, args, 1, 3, _V4), align=16)
            items = [builder.extract_element(vec, ir.Constant(_I32, k)) for k in range(4)]
            return context.make_tuple(builder, ret, items)

        return ret(sh, i), codegen

    @intrinsic
    def store_words4_3d(typingctx, dst, i0, i1, i2, w0, w1, w2, w3):
        """dst[i0, i1, i2 : i2 + 8] = four uint32 (bf16 pairs), one 16-byte store."""
        if not _u16(dst, 3) or any(w != types.uint32 for w in (w0, w1, w2, w3)):
            raise TypingError("store_words4_3d takes a 3-d uint16 array, 3 indices, 4 uint32")

        def codegen(context, builder, sig, args):
            vec = ir.Constant(_V4, ir.Undefined)
            for k in range(4):
                vec = builder.insert_element(vec, args[4 + k], ir.Constant(_I32, k))
            builder.store(vec, _pointer(context, builder, sig, args, 3, 1, _V4), align=16)
            return context.get_dummy_value()

        return types.void(dst, i0, i1, i2, w0, w1, w2, w3), codegen

    @intrinsic
    def store_word_shared(typingctx, sh, i, w):
        """sh[i : i + 2] = w (a uint32 bf16 pair; i even), one 4-byte shared store."""
        if not _u16(sh, 1) or w != types.uint32:
            raise TypingError(
                "store_word_shared takes a 1-d uint16 shared array, an index, a uint32"
            )

        def codegen(context, builder, sig, args):
            builder.store(args[2], _pointer(context, builder, sig, args, 1, 3, _I32), align=4)
            return context.get_dummy_value()

        return types.void(sh, i, w), codegen

else:
    from euler.gpu.async_copy import unravel3

    @cuda.jit(device=True)
    def cp_async16_bf16(sh, i, src, i0, i1, i2, n):
        """The simulator's 16-byte copy of bf16: synchronous, zeros past n bytes."""
        for k in range(8):
            sh[i + k] = src[i0, i1, i2 + k] if 2 * k < n else np.uint16(0)

    @cuda.jit(device=True)
    def cp_async16_bf16_flat(sh, i, src, k):
        """The simulator's flat 16-byte copy of bf16 (3-d src): synchronous."""
        i0, i1, i2 = unravel3(src, k)
        for m in range(8):
            sh[i + m] = src[i0, i1, i2 + m]

    def _word(lo, hi) -> np.uint32:
        return np.uint32(int(lo) | (int(hi) << 16))

    @cuda.jit(device=True)
    def load_words4_shared(sh, i):
        """The simulator's 16-byte load of four bf16 pairs."""
        w = [_word(sh[i + 2 * k], sh[i + 2 * k + 1]) for k in range(4)]
        return w[0], w[1], w[2], w[3]

    @cuda.jit(device=True)
    def store_words4_3d(dst, i0, i1, i2, w0, w1, w2, w3):
        """The simulator's 16-byte store of four bf16 pairs."""
        for k, w in enumerate((w0, w1, w2, w3)):
            dst[i0, i1, i2 + 2 * k] = np.uint16(int(w) & 0xFFFF)
            dst[i0, i1, i2 + 2 * k + 1] = np.uint16(int(w) >> 16)

    @cuda.jit(device=True)
    def store_word_shared(sh, i, w):
        """The simulator's 4-byte store of a bf16 pair."""
        sh[i] = np.uint16(int(w) & 0xFFFF)
        sh[i + 1] = np.uint16(int(w) >> 16)
