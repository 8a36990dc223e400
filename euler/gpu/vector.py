"""16-byte loads and stores (ld.global.v4 / st.global.v4) and vector atomics for numba.cuda.

The memory-bound kernels (RMSNorm, SwiGLU, RoPE, the residual add) need many bytes in
flight per multiprocessor to reach the memory's bandwidth (Little's law: bandwidth x
latency / multiprocessors, tens of KB on a Hopper GPU), more than warps issuing one 4-byte
load per thread and step keep in flight. Numba emits only scalar accesses, so these
intrinsics move 4 consecutive float32 as one LLVM <4 x float> access with 16-byte
alignment, which NVPTX lowers to the vector instructions:

    float32           load4, store4 (1-d), load4_3d, store4_3d (3-d, along the last axis),
                      store4_flat (element k of a C-contiguous array)
    float32, shared   load4_shared (ld.shared.v4.f32, LDS.128), load2_shared (.v2)
    atomic adds       atomic_add2, atomic_add4 (3-d), atomic_add2_flat, atomic_add4_flat:
                      one red.global.add.v2.f32 or .v4.f32 (sm_90) for 2 or 4 elements,
                      each element's add atomic
    bf16 bits         load4_u32, store4_u32, load2_u32, store2_u32, load4_u32_3d,
                      store4_u32_3d: 8 (or 4) elements as uint32 words, word k holding
                      element 2k in its low half and 2k + 1 in its high half
    bf16 as float32   load8_bf16, store8_bf16, load4_bf16, store4_bf16, load8_bf16_3d,
                      store8_bf16_3d: the words widened by layer_math.bf16_widen (NVVM folds
                      it to a shift or a mask) or rounded to nearest even by bf16_round

bf16 tensors are uint16 arrays of their bits (euler.precision). An index must be a multiple
of 4 elements (of 8 for a 16-byte bf16 access) and the data 16-byte aligned: launchers
check with `aligned4`, `aligned8_bf16`, or async_copy.check_aligned for 3-d arrays, whose
rows must hold a whole number of 16 bytes. The element pointer is computed without numba's
negative-index wraparound. In the CUDA simulator every access is an element loop and the
widening and packing run as they are, so the simulator checks them.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR
from euler.layer_math import bf16_round, bf16_widen


def _aligned(arrays, dtype, multiple: int) -> bool:
    """Whether every array is of dtype, C-contiguous, of a size divisible by `multiple` (the
    elements of a 16-byte piece) and starts on 16 bytes (device or host arrays)."""
    for a in arrays:
        if a.dtype != dtype or a.size % multiple or not a.flags["C_CONTIGUOUS"]:
            return False
        iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
        if iface["data"][0] % 16:
            return False
    return True


def aligned4(*arrays) -> bool:
    """Whether every array is float32, C-contiguous, of a size divisible by 4 and starts on
    16 bytes: the condition for the load4/store4 kernels (device or host arrays)."""
    return _aligned(arrays, np.float32, 4)


def check_dtypes(where: str, dtype, **arrays) -> None:
    """ValueError naming `where` and the first of arrays (name=array) whose dtype is not
    dtype: a bf16 kernel would read its bytes as another type's."""
    want = "uint16 (bf16 bits)" if np.dtype(dtype) == np.uint16 else np.dtype(dtype).name
    for name, a in arrays.items():
        if a.dtype != dtype:
            raise ValueError(f"{where}: {name} is {a.dtype}; {want} expected")


def aligned8_bf16(*arrays) -> bool:
    """Whether every array is bf16 (uint16 bits), C-contiguous, of a size divisible by 8 and
    starts on 16 bytes: the condition for the load8_bf16/store8_bf16 kernels (device or host
    arrays)."""
    return _aligned(arrays, np.uint16, 8)


if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr, flat_ptr

    _V4 = ir.VectorType(ir.FloatType(), 4)

    def _vector_ptr(context, builder, aryty, ary, inds, indtys, space: int = 1):
        """<4 x float> pointer to ary[inds] (no wraparound, no bounds check) in address
        space `space`: 1 global, 3 shared (numba-cuda keeps a shared array's data as a
        generic pointer; the cast back lets NVPTX emit ld.shared)."""
        p = element_ptr(context, builder, aryty, ary, list(inds), list(indtys))
        p = builder.addrspacecast(p, ir.PointerType(p.type.pointee, space))
        return builder.bitcast(p, ir.PointerType(_V4, space))

    def _check(name: str, ary, *indices) -> None:
        ok = (
            isinstance(ary, types.Array)
            and ary.ndim == len(indices)
            and ary.dtype == types.float32
            and all(isinstance(i, types.Integer) for i in indices)
        )
        if not ok:
            n = len(indices)
            raise TypingError(f"{name} takes a {n}-d float32 array and {n} integer indices")

    def _load4_typing(name: str, ary, indices, space: int = 1, width: int = 4):
        _check(name, ary, *indices)
        ret = types.UniTuple(types.float32, width)
        n = len(indices)

        def codegen(context, builder, sig, args):
            ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1 : 1 + n],
                              sig.args[1 : 1 + n], space)  # fmt: skip
            if width != 4:
                vt = ir.VectorType(ir.FloatType(), width)
                ptr = builder.bitcast(ptr, ir.PointerType(vt, space))
            vec = builder.load(ptr, align=4 * width)
            items = [
                builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(width)
            ]
            return context.make_tuple(builder, ret, items)

        return ret(ary, *indices), codegen

    @intrinsic
    def load4(typingctx, ary, i):
        """ary[i : i + 4] as a 4-tuple of float32, one 16-byte load."""
        return _load4_typing("load4", ary, (i,))

    @intrinsic
    def load4_shared(typingctx, ary, i):
        """sm[i : i + 4] of a shared array as a 4-tuple of float32, one 16-byte load."""
        return _load4_typing("load4_shared", ary, (i,), 3)

    @intrinsic
    def load2_shared(typingctx, ary, i):
        """sm[i : i + 2] of a shared array (i even) as a pair of float32, one 8-byte load."""
        return _load4_typing("load2_shared", ary, (i,), 3, width=2)

    @intrinsic
    def load4_3d(typingctx, ary, i0, i1, i2):
        """ary[i0, i1, i2 : i2 + 4] of a 3-d array as a 4-tuple of float32, one 16-byte load."""
        return _load4_typing("load4_3d", ary, (i0, i1, i2))

    def _store4_typing(name: str, ary, indices, values, flat: bool = False):
        if flat:  # one index, element k in C order of a C-contiguous array of any rank
            if not (isinstance(ary, types.Array) and ary.layout == "C"):
                raise TypingError(f"{name} takes a C-contiguous float32 array")
            _check(name, ary.copy(ndim=1), *indices)
        else:
            _check(name, ary, *indices)
        if not all(isinstance(a, types.Float) for a in values):
            raise TypingError(f"{name} stores four floats")
        n = len(indices)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(_V4, ir.Undefined)
            for k in range(4):
                v = context.cast(builder, args[1 + n + k], sig.args[1 + n + k], types.float32)
                vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), k))
            if flat:
                p = flat_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                p = builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))
                ptr = builder.bitcast(p, ir.PointerType(_V4, 1))
            else:
                ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1 : 1 + n],
                                  sig.args[1 : 1 + n])  # fmt: skip
            builder.store(vec, ptr, align=16)
            return context.get_dummy_value()

        return types.void(ary, *indices, *values), codegen

    @intrinsic
    def store4(typingctx, ary, i, a0, a1, a2, a3):
        """ary[i : i + 4] = (a0, a1, a2, a3), one 16-byte store."""
        return _store4_typing("store4", ary, (i,), (a0, a1, a2, a3))

    @intrinsic
    def store4_3d(typingctx, ary, i0, i1, i2, a0, a1, a2, a3):
        """ary[i0, i1, i2 : i2 + 4] = (a0, .., a3) of a 3-d array, one 16-byte store."""
        return _store4_typing("store4_3d", ary, (i0, i1, i2), (a0, a1, a2, a3))

    @intrinsic
    def store4_flat(typingctx, ary, k, a0, a1, a2, a3):
        """Elements k .. k + 3 (C order) of a C-contiguous array = (a0, .., a3), one 16-byte
        store."""
        return _store4_typing("store4_flat", ary, (k,), (a0, a1, a2, a3), flat=True)

    def _atomic_add_typing(ary, indices, values):
        """The signature of an atomic_add of len(values) floats, or a TypingError."""
        n = len(values)
        ok = (
            isinstance(ary, types.Array)
            and ary.ndim == 3
            and ary.dtype == types.float32
            and (len(indices) == 3 or ary.layout == "C")
            and all(isinstance(i, types.Integer) for i in indices)
            and all(v == types.float32 for v in values)
        )
        if not ok:
            raise TypingError(
                f"atomic_add{n} takes a 3-d float32 array, 3 indices (or 1 of a C-contiguous "
                f"array), {n} float32"
            )

        def codegen(context, builder, sig, args):
            m = len(indices)
            if m == 1:
                p = flat_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            else:
                p = element_ptr(context, builder, sig.args[0], args[0], args[1:4], sig.args[1:4])
            f32 = ir.FloatType()
            fnty = ir.FunctionType(ir.VoidType(), [p.type] + [f32] * n)
            regs = ", ".join(f"${k + 1}" for k in range(n))
            text = f"red.global.add.v{n}.f32 [$0], {{{regs}}};"
            asm = ir.InlineAsm(fnty, text, "l" + ",f" * n + ",~{memory}", side_effect=True)
            builder.call(asm, [p, *args[1 + m :]])
            return context.get_dummy_value()

        return types.void(ary, *indices, *values), codegen

    @intrinsic
    def atomic_add2(typingctx, ary, i0, i1, i2, a0, a1):
        """ary[i0, i1, i2 : i2 + 2] += (a0, a1), one vector reduction (sm_90)."""
        return _atomic_add_typing(ary, (i0, i1, i2), (a0, a1))

    @intrinsic
    def atomic_add2_flat(typingctx, ary, k, a0, a1):
        """ary[i0, i1, i2 : i2 + 2] += (a0, a1) where k = (i0 n1 + i1) n2 + i2 (C order)."""
        return _atomic_add_typing(ary, (k,), (a0, a1))

    @intrinsic
    def atomic_add4(typingctx, ary, i0, i1, i2, a0, a1, a2, a3):
        """ary[i0, i1, i2 : i2 + 4] += (a0, .., a3), one vector reduction (sm_90)."""
        return _atomic_add_typing(ary, (i0, i1, i2), (a0, a1, a2, a3))

    @intrinsic
    def atomic_add4_flat(typingctx, ary, k, a0, a1, a2, a3):
        """ary[i0, i1, i2 : i2 + 4] += (a0, .., a3) where k = (i0 n1 + i1) n2 + i2 (C order)."""
        return _atomic_add_typing(ary, (k,), (a0, a1, a2, a3))

    def _check_words(name: str, ary, indices, values=()) -> None:
        ok = (
            isinstance(ary, types.Array)
            and ary.ndim == len(indices)
            and ary.dtype == types.uint16
            and all(isinstance(i, types.Integer) for i in (*indices, *values))
        )
        if not ok:
            n = len(indices)
            raise TypingError(f"{name} takes a {n}-d uint16 array, {n} integer indices and "
                              "integer words")  # fmt: skip

    def _words_ptr(context, builder, sig, args, n: int, words: int):
        """<words x i32> global pointer to the uint16 element at args[1 : 1 + n]."""
        p = element_ptr(context, builder, sig.args[0], args[0], list(args[1 : 1 + n]),
                        list(sig.args[1 : 1 + n]))  # fmt: skip
        p = builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))
        return builder.bitcast(p, ir.PointerType(ir.VectorType(ir.IntType(32), words), 1))

    def _load_words_typing(name: str, ary, indices, words: int):
        _check_words(name, ary, indices)
        ret = types.UniTuple(types.uint32, words)
        n = len(indices)

        def codegen(context, builder, sig, args):
            vec = builder.load(_words_ptr(context, builder, sig, args, n, words), align=4 * words)
            items = [
                builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(words)
            ]
            return context.make_tuple(builder, ret, items)

        return ret(ary, *indices), codegen

    def _store_words_typing(name: str, ary, indices, values):
        _check_words(name, ary, indices, values)
        n, words = len(indices), len(values)
        i32 = ir.IntType(32)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(ir.VectorType(i32, words), ir.Undefined)
            for k in range(words):
                v = context.cast(builder, args[1 + n + k], sig.args[1 + n + k], types.uint32)
                vec = builder.insert_element(vec, v, ir.Constant(i32, k))
            ptr = _words_ptr(context, builder, sig, args, n, words)
            builder.store(vec, ptr, align=4 * words)
            return context.get_dummy_value()

        return types.void(ary, *indices, *values), codegen

    @intrinsic
    def load4_u32(typingctx, ary, i):
        """The bits of ary[i : i + 8] (uint16) as 4 uint32 words, one 16-byte load."""
        return _load_words_typing("load4_u32", ary, (i,), 4)

    @intrinsic
    def load2_u32(typingctx, ary, i):
        """The bits of ary[i : i + 4] (uint16) as 2 uint32 words, one 8-byte load."""
        return _load_words_typing("load2_u32", ary, (i,), 2)

    @intrinsic
    def load4_u32_3d(typingctx, ary, i0, i1, i2):
        """The bits of ary[i0, i1, i2 : i2 + 8] (uint16) as 4 uint32 words, one 16-byte load."""
        return _load_words_typing("load4_u32_3d", ary, (i0, i1, i2), 4)

    @intrinsic
    def store4_u32(typingctx, ary, i, w0, w1, w2, w3):
        """ary[i : i + 8] (uint16) = the bits of words w0 .. w3, one 16-byte store."""
        return _store_words_typing("store4_u32", ary, (i,), (w0, w1, w2, w3))

    @intrinsic
    def store2_u32(typingctx, ary, i, w0, w1):
        """ary[i : i + 4] (uint16) = the bits of words w0, w1, one 8-byte store."""
        return _store_words_typing("store2_u32", ary, (i,), (w0, w1))

    @intrinsic
    def store4_u32_3d(typingctx, ary, i0, i1, i2, w0, w1, w2, w3):
        """ary[i0, i1, i2 : i2 + 8] (uint16) = the bits of words w0 .. w3, one 16-byte store."""
        return _store_words_typing("store4_u32_3d", ary, (i0, i1, i2), (w0, w1, w2, w3))

else:
    from euler.gpu.async_copy import unravel3

    @cuda.jit(device=True)
    def load4(ary, i):
        """The simulator's load4: four element loads."""
        return ary[i], ary[i + 1], ary[i + 2], ary[i + 3]

    load4_shared = load4

    @cuda.jit(device=True)
    def load2_shared(ary, i):
        """The simulator's load2_shared: two element loads."""
        return ary[i], ary[i + 1]

    @cuda.jit(device=True)
    def store4(ary, i, a0, a1, a2, a3):
        """The simulator's store4: four element stores."""
        ary[i] = a0
        ary[i + 1] = a1
        ary[i + 2] = a2
        ary[i + 3] = a3

    @cuda.jit(device=True)
    def load4_3d(ary, i0, i1, i2):
        """The simulator's load4_3d: four element loads."""
        return ary[i0, i1, i2], ary[i0, i1, i2 + 1], ary[i0, i1, i2 + 2], ary[i0, i1, i2 + 3]

    @cuda.jit(device=True)
    def store4_3d(ary, i0, i1, i2, a0, a1, a2, a3):
        """The simulator's store4_3d: four element stores."""
        ary[i0, i1, i2] = a0
        ary[i0, i1, i2 + 1] = a1
        ary[i0, i1, i2 + 2] = a2
        ary[i0, i1, i2 + 3] = a3

    @cuda.jit(device=True)
    def store4_flat(ary, k, a0, a1, a2, a3):
        """The simulator's store4_flat (3-d ary): store4_3d at the 3-d index of k."""
        i0, i1, i2 = unravel3(ary, k)
        store4_3d(ary, i0, i1, i2, a0, a1, a2, a3)

    @cuda.jit(device=True)
    def atomic_add2(ary, i0, i1, i2, a0, a1):
        """The simulator's atomic_add2: two atomic adds."""
        cuda.atomic.add(ary, (i0, i1, i2), a0)
        cuda.atomic.add(ary, (i0, i1, i2 + 1), a1)

    @cuda.jit(device=True)
    def atomic_add2_flat(ary, k, a0, a1):
        """The simulator's atomic_add2_flat: atomic_add2 at the 3-d index of k."""
        i0, i1, i2 = unravel3(ary, k)
        atomic_add2(ary, i0, i1, i2, a0, a1)

    @cuda.jit(device=True)
    def atomic_add4(ary, i0, i1, i2, a0, a1, a2, a3):
        """The simulator's atomic_add4: four atomic adds."""
        cuda.atomic.add(ary, (i0, i1, i2), a0)
        cuda.atomic.add(ary, (i0, i1, i2 + 1), a1)
        cuda.atomic.add(ary, (i0, i1, i2 + 2), a2)
        cuda.atomic.add(ary, (i0, i1, i2 + 3), a3)

    @cuda.jit(device=True)
    def atomic_add4_flat(ary, k, a0, a1, a2, a3):
        """The simulator's atomic_add4_flat: atomic_add4 at the 3-d index of k."""
        i0, i1, i2 = unravel3(ary, k)
        atomic_add4(ary, i0, i1, i2, a0, a1, a2, a3)

    @cuda.jit(device=True)
    def _word(lo, hi):
        """The uint32 word of uint16 elements lo (low half), hi (high half)."""
        return np.uint32(lo) | (np.uint32(hi) << np.uint32(16))

    @cuda.jit(device=True)
    def load4_u32(ary, i):
        """The simulator's load4_u32: eight element loads, packed in words."""
        return (_word(ary[i], ary[i + 1]), _word(ary[i + 2], ary[i + 3]),
                _word(ary[i + 4], ary[i + 5]), _word(ary[i + 6], ary[i + 7]))  # fmt: skip

    @cuda.jit(device=True)
    def load2_u32(ary, i):
        """The simulator's load2_u32: four element loads, packed in words."""
        return _word(ary[i], ary[i + 1]), _word(ary[i + 2], ary[i + 3])

    @cuda.jit(device=True)
    def load4_u32_3d(ary, i0, i1, i2):
        """The simulator's load4_u32_3d: load4_u32 of the row ary[i0, i1]."""
        return load4_u32(ary[i0, i1], i2)

    @cuda.jit(device=True)
    def store2_u32(ary, i, w0, w1):
        """The simulator's store2_u32: four element stores."""
        for k, w in ((0, w0), (2, w1)):
            ary[i + k], ary[i + k + 1] = np.uint16(w & np.uint32(0xFFFF)), np.uint16(w >> 16)

    @cuda.jit(device=True)
    def store4_u32(ary, i, w0, w1, w2, w3):
        """The simulator's store4_u32: eight element stores."""
        store2_u32(ary, i, w0, w1)
        store2_u32(ary, i + 4, w2, w3)

    @cuda.jit(device=True)
    def store4_u32_3d(ary, i0, i1, i2, w0, w1, w2, w3):
        """The simulator's store4_u32_3d: store4_u32 into the row ary[i0, i1]."""
        store4_u32(ary[i0, i1], i2, w0, w1, w2, w3)


# ---------------------------------------------------------------- bf16 as float32: both targets


@cuda.jit(device=True, inline=True)
def widen_low(w):
    """The float32 of the bf16 in the low half of word w (uint32)."""
    return bf16_widen(np.uint16(w & np.uint32(0xFFFF)))


@cuda.jit(device=True, inline=True)
def widen_high(w):
    """The float32 of the bf16 in the high half of word w (uint32)."""
    return bf16_widen(np.uint16(w >> np.uint32(16)))


@cuda.jit(device=True, inline=True)
def pack_bf16(lo, hi):
    """The uint32 word of bf16(lo) (low half) and bf16(hi) (high half), each rounded to
    nearest even from float32."""
    return np.uint32(bf16_round(lo)) | (np.uint32(bf16_round(hi)) << np.uint32(16))


@cuda.jit(device=True, inline=True)
def load8_bf16(ary, i):
    """ary[i : i + 8] of a 1-d bf16 (uint16) array as 8 float32, one 16-byte load."""
    w0, w1, w2, w3 = load4_u32(ary, i)
    return (widen_low(w0), widen_high(w0), widen_low(w1), widen_high(w1),
            widen_low(w2), widen_high(w2), widen_low(w3), widen_high(w3))  # fmt: skip


@cuda.jit(device=True, inline=True)
def load8_bf16_3d(ary, i0, i1, i2):
    """ary[i0, i1, i2 : i2 + 8] of a 3-d bf16 array as 8 float32, one 16-byte load."""
    w0, w1, w2, w3 = load4_u32_3d(ary, i0, i1, i2)
    return (widen_low(w0), widen_high(w0), widen_low(w1), widen_high(w1),
            widen_low(w2), widen_high(w2), widen_low(w3), widen_high(w3))  # fmt: skip


@cuda.jit(device=True, inline=True)
def load4_bf16(ary, i):
    """ary[i : i + 4] of a 1-d bf16 array as 4 float32, one 8-byte load (i % 4 == 0)."""
    w0, w1 = load2_u32(ary, i)
    return widen_low(w0), widen_high(w0), widen_low(w1), widen_high(w1)


@cuda.jit(device=True, inline=True)
def store8_bf16(ary, i, v0, v1, v2, v3, v4, v5, v6, v7):
    """ary[i : i + 8] of a 1-d bf16 array = float32 v0 .. v7 rounded to nearest even, one
    16-byte store."""
    store4_u32(ary, i, pack_bf16(v0, v1), pack_bf16(v2, v3), pack_bf16(v4, v5),
               pack_bf16(v6, v7))  # fmt: skip


@cuda.jit(device=True, inline=True)
def store8_bf16_3d(ary, i0, i1, i2, v0, v1, v2, v3, v4, v5, v6, v7):
    """ary[i0, i1, i2 : i2 + 8] of a 3-d bf16 array = bf16(v0 .. v7), one 16-byte store."""
    store4_u32_3d(ary, i0, i1, i2, pack_bf16(v0, v1), pack_bf16(v2, v3), pack_bf16(v4, v5),
                  pack_bf16(v6, v7))  # fmt: skip


@cuda.jit(device=True, inline=True)
def store4_bf16(ary, i, v0, v1, v2, v3):
    """ary[i : i + 4] of a 1-d bf16 array = bf16(v0 .. v3), one 8-byte store (i % 4 == 0)."""
    store2_u32(ary, i, pack_bf16(v0, v1), pack_bf16(v2, v3))
