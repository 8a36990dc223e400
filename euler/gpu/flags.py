"""Flags between the blocks of one kernel: one block raises, others wait (sm_70+ PTX).

    flag_release()          fence.acq_rel.gpu;
    flag_raise(flags, i)    red.relaxed.gpu.global.add.s32 [&flags[i]], 1;
    v = flag_read(flags, i) ld.relaxed.gpu.global.s32 v, [&flags[i]];

flags is a 1-d int32 array, zeroed before the launch. The raiser's block meets at a barrier,
then one thread releases and raises: the fence (cumulative) orders every thread's earlier
stores before the flags raised after it, the pattern of CUTLASS's
GenericBarrier::arrive_inc; one thread's acq_rel fence instead of a fence.sc (numba's
threadfence) in each. The fence may wait for that thread's copies in flight, so a thread
with copies in flight raises seldom (attention_tc.TcOptions.prep_flag_every).

A waiter's thread reads the flag until it is set, then meets its block at a barrier before
any thread reads what the flag guards. The read is relaxed, not acquire, so that it may be
issued an iteration ahead and waited for only at its use; the guarded reads are issued
after the barrier that follows the test, which they cannot pass.

In the CUDA simulator, where blocks run one after another, both are plain array accesses.
"""

from __future__ import annotations

from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr, statement_intrinsic

    def _check(name: str, flags, i) -> None:
        ok = (
            isinstance(flags, types.Array)
            and flags.ndim == 1
            and flags.dtype == types.int32
            and isinstance(i, types.Integer)
        )
        if not ok:
            raise TypingError(f"{name} takes a 1-d int32 array and an integer index")

    def _pointer(context, builder, sig, args):
        p = element_ptr(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
        return builder.ptrtoint(p, ir.IntType(64))

    flag_release = statement_intrinsic(
        "fence.acq_rel.gpu;",
        "A release fence at device scope: what this thread (and, through a barrier before it,"
        " its block) stored is visible on the device before what it stores next.",
    )

    @intrinsic
    def flag_raise(typingctx, flags, i):
        """flags[i] += 1 on the device (after flag_release: what it guards is visible)."""
        _check("flag_raise", flags, i)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)])
            ptx = "red.relaxed.gpu.global.add.s32 [$0], 1;"
            asm = ir.InlineAsm(fnty, ptx, "l,~{memory}", side_effect=True)
            builder.call(asm, [_pointer(context, builder, sig, args)])
            return context.get_dummy_value()

        return types.void(flags, i), codegen

    @intrinsic
    def flag_read(typingctx, flags, i):
        """flags[i] as the device sees it now (a relaxed load past the L1)."""
        _check("flag_read", flags, i)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "ld.relaxed.gpu.global.s32 $0, [$1];", "=r,l,~{memory}",
                               side_effect=True)  # fmt: skip
            return builder.call(asm, [_pointer(context, builder, sig, args)])

        return types.int32(flags, i), codegen

else:

    @cuda.jit(device=True)
    def flag_release():
        pass

    @cuda.jit(device=True)
    def flag_raise(flags, i):
        flags[i] += 1

    @cuda.jit(device=True)
    def flag_read(flags, i):
        return flags[i]
