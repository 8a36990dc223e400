"""Arrival counters: which of several blocks reaches a piece of output first, in one kernel.

The tensor-core attention backward adds dQ into memory with atomics, one tile's worth from
each block whose keys reach it; the first to arrive can store instead of add, and then
nothing has to zero dQ beforehand (attention_tc.FIRST_STORE). Each adder owns a uint32
counter (zero before the kernel, and left zero after it):

    old = arrive(counts, i, 1)          its arrival: old & 0xFFFF adders came before it
    observe(counts, i)                  the counter now, for a wait
    arrive(counts, i, PASSED)           done with its output: old >> 16 adders were done

Both are acquire-release at GPU scope (atom.acq_rel.gpu, ld.acquire.gpu): the first
adder's plain stores happen before its PASSED arrival, and every later adder sees them
once it has seen PASSED. The adder that finds every other one done clears the counter.

In the CUDA simulator they are its atomic add and a plain load (its blocks run one at a
time, so the first block to arrive has passed before the next begins).
"""

from __future__ import annotations

from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR

PASSED = 1 << 16  # added to an adder's counter when it is done; arrivals count below it

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr

    def _counter_ptr(context, builder, sig, args):
        """Global pointer to counts[i] of a 1-d uint32 array, and the i32 type."""
        i32 = ir.IntType(32)
        p = element_ptr(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
        return builder.addrspacecast(p, ir.PointerType(i32, 1)), i32

    def _check(name: str, ary, i) -> None:
        ok = (
            isinstance(ary, types.Array)
            and ary.ndim == 1
            and ary.dtype == types.uint32
            and isinstance(i, types.Integer)
        )
        if not ok:
            raise TypingError(f"{name} takes a 1-d uint32 array and an integer index")

    @intrinsic
    def arrive(typingctx, counts, i, value):
        """counts[i] += value atomically (atom.acq_rel.gpu); returns the old count (as int64,
        so that comparing it with signed integers stays integer arithmetic)."""
        _check("arrive", counts, i)

        def codegen(context, builder, sig, args):
            p, i32 = _counter_ptr(context, builder, sig, args)
            v = context.cast(builder, args[2], sig.args[2], types.uint32)
            fnty = ir.FunctionType(i32, [p.type, i32])
            text = "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;"
            asm = ir.InlineAsm(fnty, text, "=r,l,r,~{memory}", side_effect=True)
            return builder.zext(builder.call(asm, [p, v]), ir.IntType(64))

        return types.int64(counts, i, value), codegen

    @intrinsic
    def observe(typingctx, counts, i):
        """counts[i] by ld.acquire.gpu (as int64): what an adder waiting for PASSED polls."""
        _check("observe", counts, i)

        def codegen(context, builder, sig, args):
            p, i32 = _counter_ptr(context, builder, sig, args)
            fnty = ir.FunctionType(i32, [p.type])
            text = "ld.acquire.gpu.global.u32 $0, [$1];"
            asm = ir.InlineAsm(fnty, text, "=r,l,~{memory}", side_effect=True)
            return builder.zext(builder.call(asm, [p]), ir.IntType(64))

        return types.int64(counts, i), codegen

else:

    @cuda.jit(device=True)
    def arrive(counts, i, value):
        """The simulator's arrive: its atomic add."""
        return int(cuda.atomic.add(counts, i, value))

    @cuda.jit(device=True)
    def observe(counts, i):
        """The simulator's observe: a load."""
        return int(counts[i])
