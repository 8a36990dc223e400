"""Asynchronous global-to-shared copies (cp.async, sm_80+) for numba.cuda kernels.

numba.cuda has no cp.async, so these emit the PTX through llvmlite inline assembly:

    cp_async16(dst, i, src, i0, i1, i2, n)   cp.async.cg.shared.global [dst + 4i], [src], 16, n;
    cp_async4(dst, i, src, i0, i1, i2, n)    cp.async.ca.shared.global [dst + 4i], [src], 4, n;
    cp_async16_flat(dst, i, src, k)          cp.async.cg.shared.global [dst + 4i], [src + 4k], 16;
    cp_async4_flat(dst, i, src, k)           cp.async.ca.shared.global [dst + 4i], [src + 4k], 4;
    cp_async_commit()                        cp.async.commit_group;
    cp_async_wait(N)                         cp.async.wait_group N;  (N an integer constant)

dst is a 1-d float32 shared array and i an element index; src a 3-d float32 array and
(i0, i1, i2) the first element copied: 16 bytes (4 consecutive floats) or 4. The copy reads
n bytes of src (0 <= n <= the size; an integer) and fills the rest of the destination with
zeros, so a row past the end of a sequence costs no branch: n = 0 (src must still be a
valid address: clamp the row). A 16-byte copy needs both addresses 16-byte aligned.
The _flat forms copy whole, in-range pieces from src's element k in C order (any C-contiguous
float32 array): a kernel that steps k by a row's length per copy computes one 64-bit add a
copy, where the clamped 3-d index costs about ten instructions (docs/gpu.md).

The copies a thread issues run in the background; commit_group closes them into a group,
and wait_group N blocks the thread until at most its N most recent groups are still in
flight. Their data is then visible to this thread only: a block barrier must follow before
other threads read it. Double buffering: issue tile j + 1, commit, wait_group 1 (tile j has
landed), barrier, compute on tile j, barrier (before tile j + 2 overwrites tile j's buffer).

The shared operand of cp.async is a 32-bit address in the shared window: numba-cuda keeps
a shared array's data as a generic pointer (addrspacecast of an addrspace(3) global), so
the element pointer is cast back to addrspace(3) and converted to i32, which NVPTX lowers
to cvta.to.shared. The asm statements are volatile and clobber memory, so LLVM neither
drops them nor moves shared loads across them.

In the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the copy is a plain synchronous copy and
commit and wait do nothing: the barrier that must follow a wait keeps the kernels correct
in both.
"""

from __future__ import annotations

from numba import config, cuda, float32, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR


def check_aligned(*arrays) -> None:
    """cp.async copies 16 bytes from addresses 16-byte aligned: C-contiguous 3-d arrays whose
    rows are a whole number of 16 bytes starting on 16 bytes (ValueError otherwise)."""
    for a in arrays:
        if not (a.flags["C_CONTIGUOUS"] and a.ndim == 3 and a.shape[2] % 4 == 0):
            raise ValueError(f"cp.async: an array of shape {a.shape} is not C-contiguous "
                             "(B, T, C) with C a multiple of 4")  # fmt: skip
        if not config.ENABLE_CUDASIM:  # whose arrays have no device address
            face = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
            if face["data"][0] % 16:
                raise ValueError(f"cp.async: an array of shape {a.shape} starts off 16 bytes")


if not SIMULATOR:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    def element_ptr(context, builder, aryty, ary, inds, indtys):
        """Pointer to ary[inds] (no wraparound, no bounds check)."""
        arr = context.make_array(aryty)(context, builder, ary)
        ix = [context.cast(builder, v, t, types.intp) for v, t in zip(inds, indtys, strict=True)]
        return cgutils.get_item_pointer(context, builder, aryty, arr, ix, wraparound=False)

    def flat_ptr(context, builder, aryty, ary, k, kty):
        """Pointer to the element k (in C order) of a C-contiguous array."""
        data = context.make_array(aryty)(context, builder, ary).data
        return builder.gep(data, [context.cast(builder, k, kty, types.intp)])

    def shared_address(builder, ptr):
        """The i32 shared-window address of a generic pointer into a shared array (what
        instructions with a .shared operand take; NVPTX lowers it to cvta.to.shared)."""
        shared = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
        return builder.ptrtoint(shared, ir.IntType(32))

    def _copy_asm(builder, ptx: str, dst, src, *more) -> None:
        """The cp.async statement ptx on a generic shared pointer dst and a global src."""
        i32, i64 = ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i32, i64] + [i32] * len(more))
        constraints = "r,l" + ",r" * len(more) + ",~{memory}"
        asm = ir.InlineAsm(fnty, ptx, constraints, side_effect=True)
        builder.call(asm, [shared_address(builder, dst), builder.ptrtoint(src, i64), *more])

    def _make_copy(size: int, cache: str):
        ptx = f"cp.async.{cache}.shared.global [$0], [$1], {size}, $2;"

        def cp_async(typingctx, dst, i, src, i0, i1, i2, n):
            ok = (
                isinstance(dst, types.Array)
                and dst.ndim == 1
                and isinstance(src, types.Array)
                and src.ndim == 3
                and dst.dtype == src.dtype == types.float32
                and all(isinstance(x, types.Integer) for x in (i, i0, i1, i2, n))
            )
            if not ok:
                raise TypingError(f"cp_async{size} takes (1-d, int, 3-d, 3 ints, int) float32")

            def codegen(context, builder, sig, args):
                t = sig.args
                d = element_ptr(context, builder, t[0], args[0], [args[1]], [t[1]])
                s = element_ptr(context, builder, t[2], args[2], args[3:6], t[3:6])
                nbytes = context.cast(builder, args[6], t[6], types.int32)
                _copy_asm(builder, ptx, d, s, nbytes)
                return context.get_dummy_value()

            return types.void(dst, i, src, i0, i1, i2, n), codegen

        cp_async.__name__ = cp_async.__qualname__ = f"cp_async{size}"
        return intrinsic(cp_async)

    def _make_flat_copy(size: int, cache: str):
        ptx = f"cp.async.{cache}.shared.global [$0], [$1], {size};"

        def cp_async_flat(typingctx, dst, i, src, k):
            ok = (
                isinstance(dst, types.Array)
                and dst.ndim == 1
                and isinstance(src, types.Array)
                and src.layout == "C"
                and dst.dtype == src.dtype == types.float32
                and all(isinstance(x, types.Integer) for x in (i, k))
            )
            if not ok:
                raise TypingError(
                    f"cp_async{size}_flat takes (1-d, int, C-contiguous, int) float32"
                )

            def codegen(context, builder, sig, args):
                t = sig.args
                d = element_ptr(context, builder, t[0], args[0], [args[1]], [t[1]])
                _copy_asm(builder, ptx, d, flat_ptr(context, builder, t[2], args[2], args[3], t[3]))
                return context.get_dummy_value()

            return types.void(dst, i, src, k), codegen

        cp_async_flat.__name__ = cp_async_flat.__qualname__ = f"cp_async{size}_flat"
        return intrinsic(cp_async_flat)

    # .cg (cache in L2 only) exists for 16-byte copies alone; the 4-byte ones use .ca
    cp_async16 = _make_copy(16, "cg")
    cp_async4 = _make_copy(4, "ca")
    cp_async16_flat = _make_flat_copy(16, "cg")
    cp_async4_flat = _make_flat_copy(4, "ca")

    def asm_statement(builder, text: str) -> None:
        """The PTX statement text, volatile and clobbering memory (kept, and kept in place)."""
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(ir.InlineAsm(fnty, text, "~{memory}", side_effect=True), [])

    def statement_intrinsic(text: str, doc: str):
        """An intrinsic of no arguments that emits the PTX statement text (asm_statement)."""

        def impl(typingctx):
            def codegen(context, builder, sig, args):
                asm_statement(builder, text)
                return context.get_dummy_value()

            return types.void(), codegen

        impl.__doc__ = doc
        return intrinsic(impl)

    cp_async_commit = statement_intrinsic(
        "cp.async.commit_group;",
        "Close this thread's copies issued since the last commit into one group.",
    )

    @intrinsic
    def cp_async_wait(typingctx, n):
        """Wait until at most n (a constant) of this thread's committed groups are pending."""
        if not isinstance(n, types.IntegerLiteral):
            raise TypingError(f"cp_async_wait takes an integer constant, not {n}")
        text = f"cp.async.wait_group {n.literal_value};"

        def codegen(context, builder, sig, args):
            asm_statement(builder, text)
            return context.get_dummy_value()

        return types.void(n), codegen

else:

    @cuda.jit(device=True)
    def cp_async16(dst, i, src, i0, i1, i2, n):
        """The simulator's 16-byte cp.async: a synchronous copy, zeros past n bytes."""
        for k in range(4):
            dst[i + k] = src[i0, i1, i2 + k] if 4 * k < n else float32(0.0)

    @cuda.jit(device=True)
    def cp_async4(dst, i, src, i0, i1, i2, n):
        """The simulator's 4-byte cp.async: a synchronous copy, zero if n is 0."""
        dst[i] = src[i0, i1, i2] if n > 0 else float32(0.0)

    @cuda.jit(device=True)
    def unravel3(src, k):
        """The 3-d index of src's element k in C order (the simulator's flat copies)."""
        n1, n2 = src.shape[1], src.shape[2]
        return k // (n1 * n2), (k // n2) % n1, k % n2

    @cuda.jit(device=True)
    def cp_async16_flat(dst, i, src, k):
        """The simulator's flat 16-byte cp.async (3-d src): a synchronous copy."""
        i0, i1, i2 = unravel3(src, k)
        for m in range(4):
            dst[i + m] = src[i0, i1, i2 + m]

    @cuda.jit(device=True)
    def cp_async4_flat(dst, i, src, k):
        """The simulator's flat 4-byte cp.async (3-d src): a synchronous copy."""
        i0, i1, i2 = unravel3(src, k)
        dst[i] = src[i0, i1, i2]

    @cuda.jit(device=True)
    def cp_async_commit():
        """Nothing to group: the simulator's copies are done when issued."""

    @cuda.jit(device=True)
    def cp_async_wait(n):
        """Nothing to wait for (the caller's barrier still orders the threads)."""
