"""Hopper warpgroup TF32 products (wgmma, sm_90a) for numba.cuda kernels.

A warpgroup (4 consecutive warps, 128 threads) computes D = A B + D for A 64 x 8 in
registers and B 8 x N in shared memory, described by a 64-bit matrix descriptor:

    wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32 {d..}, {a0, a1, a2, a3}, desc, p, 1, 1;

Warp w of the group holds rows 16w..16w+15 of A and D in mma.py's m16n8k8 fragment layout
(A: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); D: per 8-column block n,
d[4n..4n+3] at (g, 8n + 2t), (g, 8n + 2t + 1), (g + 8, 8n + 2t), (g + 8, 8n + 2t + 1)), so
fragments move between the two kinds of product unchanged. Each thread holds N / 2
accumulators. TF32 takes B K-major only: B[n][k] is stored with k contiguous, in "core
matrices" of 8 rows (n) by 4 k (16 bytes a row, 128 contiguous bytes). With no swizzle, B[n][k]
lies at byte

    start + (n // 8) SBO + (k // 4) LBO + (n % 8) 16 + (k % 4) 4

(start, LBO and SBO multiples of 16: `shared_desc`). The tensor core reads the top 19 bits of
each operand (truncation), so operands are rounded before they are stored (mma.tf32_operand).

The product is asynchronous: `wgmma_fence` before the first product of a group (ordering
earlier register writes before it), `wgmma_commit` closes the products issued since into a
group, and `wgmma_wait` blocks until they are done; its accumulators pass through it, so the
compiler cannot read them early. Shared memory written by ordinary stores must be published
to the tensor core's (asynchronous) proxy first: `fence_proxy_async`, then a barrier.

tests/wgmma_probe.py checks these layouts on the H200 (and the emulation against them); a dkv
kernel built on them lost to mma.sync (attention_tc.py, the note under ASYNC_KV).

numba-cuda compiles for sm_90a on a 9.x device (compile_ptx takes cc=(9, 0, "a")). The CUDA
simulator (NUMBA_ENABLE_CUDASIM=1) emulates the product: every thread of the block puts its
A fragment in shared scratch, a barrier, each thread forms its outputs from the group's A and
from B, decoded from the descriptor as the hardware reads it, a barrier; fence, commit and
wait do nothing. There the descriptor holds a byte offset into the shared array, which is why
the products take the array too (the hardware ignores it).
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, types
from numba.core.errors import TypingError

SIMULATOR = bool(config.ENABLE_CUDASIM)
GROUP = 128  # threads of a warpgroup
_ADDRESS_BITS = 0x3FFF  # the descriptor's address fields hold bytes >> 4 in 14 bits


def _fields(start: int, lbo: int, sbo: int) -> int:
    """Descriptor bits for byte address start and byte offsets lbo, sbo (no swizzle)."""
    return ((start >> 4) & _ADDRESS_BITS) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


def _check_product(name: str, sm, a, desc, acc) -> int:
    """Accumulators a thread holds (N / 2), after checking the argument types."""
    ok = (
        isinstance(sm, types.Array)
        and sm.dtype == types.float32
        and all(x == types.float32 for x in a)
        and isinstance(desc, types.Integer)
        and isinstance(acc, types.UniTuple)
        and acc.dtype == types.float32
        and acc.count in (4, 8, 16, 32)
    )
    if not ok:
        raise TypingError(f"{name} takes (float32 array, 4 float32, int, float32 4..32-tuple)")
    return acc.count


if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from euler.gpu.async_copy import element_ptr, shared_address, statement_intrinsic

    wgmma_fence = statement_intrinsic(
        "wgmma.fence.sync.aligned;", "Order earlier register writes before the next products."
    )
    wgmma_commit = statement_intrinsic(
        "wgmma.commit_group.sync.aligned;", "Close the products issued since into a group."
    )
    fence_proxy_async = statement_intrinsic(
        "fence.proxy.async.shared::cta;",
        "Publish this thread's shared-memory stores to the tensor core's reads (then a barrier).",
    )

    @intrinsic
    def wgmma_wait(typingctx, acc):
        """acc (a float32 tuple: accumulators of the products in flight), once every group
        is done (wgmma.wait_group 0); passing them through keeps their reads after it."""
        if not (isinstance(acc, types.UniTuple) and acc.dtype == types.float32):
            raise TypingError(f"wgmma_wait takes a float32 tuple, not {acc}")
        n = acc.count

        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * n), [f32] * n)
            cons = ",".join(["=f"] * n + [str(i) for i in range(n)] + ["~{memory}"])
            asm = ir.InlineAsm(fnty, "wgmma.wait_group.sync.aligned 0;", cons, side_effect=True)
            vals = [builder.extract_value(args[0], i) for i in range(n)]
            res = builder.call(asm, vals)
            out = [builder.extract_value(res, i) for i in range(n)]
            return context.make_tuple(builder, sig.return_type, out)

        return acc(acc), codegen

    @intrinsic
    def shared_desc(typingctx, sm, i, lbo, sbo):
        """uint64 descriptor of a K-major, unswizzled B operand starting at sm[i] (a 1-d
        float32 shared array; sm[i] on 16 bytes), core matrices lbo bytes apart along k and
        sbo bytes apart along n (integers, multiples of 16)."""
        if not (isinstance(sm, types.Array) and sm.ndim == 1 and sm.dtype == types.float32):
            raise TypingError("shared_desc takes a 1-d float32 shared array")
        if not all(isinstance(x, types.Integer) for x in (i, lbo, sbo)):
            raise TypingError("shared_desc takes integer index and offsets")

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            p = element_ptr(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
            start = builder.zext(shared_address(builder, p), i64)
            lbo_, sbo_ = (context.cast(builder, v, t, types.uint64)
                          for v, t in zip(args[2:], sig.args[2:], strict=True))  # fmt: skip
            c = lambda n: ir.Constant(i64, n)  # noqa: E731
            d = builder.and_(builder.lshr(start, c(4)), c(_ADDRESS_BITS))
            d = builder.or_(d, builder.shl(builder.lshr(lbo_, c(4)), c(16)))
            return builder.or_(d, builder.shl(builder.lshr(sbo_, c(4)), c(32)))

        return types.uint64(sm, i, lbo, sbo), codegen

    def _product(name: str, accumulate: bool):
        def impl(typingctx, sm, a0, a1, a2, a3, desc, acc):
            n = _check_product(name, sm, (a0, a1, a2, a3), desc, acc)
            d = ", ".join(f"${k}" for k in range(n))
            a = ", ".join(f"${2 * n + k}" for k in range(4))
            text = (
                f"{{ .reg .pred p; setp.ne.b32 p, {int(accumulate)}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{2 * n}k8.f32.tf32.tf32 "
                f"{{{d}}}, {{{a}}}, ${2 * n + 4}, p, 1, 1; }}"
            )

            def codegen(context, builder, sig, args):
                f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
                ins = [f32] * n + [i32] * 4 + [i64]
                fnty = ir.FunctionType(ir.LiteralStructType([f32] * n), ins)
                cons = ",".join(["=f"] * n + [str(k) for k in range(n)] + ["r"] * 4 + ["l"])
                # volatile: a warpgroup-collective instruction LLVM must neither drop nor move
                asm = ir.InlineAsm(fnty, text, cons, side_effect=True)
                accs = [builder.extract_value(args[6], k) for k in range(n)]
                frags = [builder.bitcast(v, i32) for v in args[1:5]]
                desc_ = context.cast(builder, args[5], sig.args[5], types.uint64)
                res = builder.call(asm, accs + frags + [desc_])
                out = [builder.extract_value(res, k) for k in range(n)]
                return context.make_tuple(builder, sig.return_type, out)

            return acc(sm, a0, a1, a2, a3, desc, acc), codegen

        impl.__name__ = impl.__qualname__ = name
        return intrinsic(impl)

    wgmma_tf32 = _product("wgmma_tf32", accumulate=True)
    wgmma_tf32_first = _product("wgmma_tf32_first", accumulate=False)

else:
    from euler.gpu.mma import TF32_MASK

    _MAX_THREADS = 1024

    @cuda.jit(device=True)
    def wgmma_fence():
        """Nothing to order in the simulator."""

    @cuda.jit(device=True)
    def wgmma_commit():
        """The simulator's products are done when issued."""

    @cuda.jit(device=True)
    def fence_proxy_async():
        """One memory in the simulator."""

    @cuda.jit(device=True)
    def wgmma_wait(acc):
        """The simulator's wait: acc as it is."""
        return acc

    @cuda.jit(device=True)
    def shared_desc(sm, i, lbo, sbo):
        """The simulator's descriptor: sm[i]'s byte offset in sm as the start address."""
        return np.uint64(_fields(4 * i, lbo, sbo))

    @cuda.jit(device=True)
    def _tf32_value(x):
        bits = np.array(x, dtype=np.float32).view(np.uint32)[()] & np.uint32(TF32_MASK)
        return float(np.array(bits, dtype=np.uint32).view(np.float32)[()])

    def _emulate(sm, a0, a1, a2, a3, desc, acc, accumulate):
        """The simulator's warpgroup product (the module docstring): this thread's outputs."""
        frag = cuda.shared.array((_MAX_THREADS, 4), np.float64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z
        )
        for k, v in enumerate((a0, a1, a2, a3)):
            frag[tid, k] = _tf32_value(v)
        cuda.syncthreads()
        group, lane = tid - tid % GROUP, tid % 32
        warp, g, t = (tid % GROUP) // 32, lane // 4, lane % 4
        d = int(desc)
        start, lbo, sbo = (
            16 * (d & _ADDRESS_BITS),
            16 * ((d >> 16) & _ADDRESS_BITS),
            16 * ((d >> 32) & _ADDRESS_BITS),
        )

        def a(row, k):  # A[row][k] of the group, from the thread that holds it
            src = group + 32 * (row // 16) + 4 * (row % 8) + k % 4
            return frag[src, (row % 16) // 8 + 2 * (k // 4)]

        def b(n, k):  # B[n][k] at the descriptor's address
            at = start + (n // 8) * sbo + (k // 4) * lbo + (n % 8) * 16 + (k % 4) * 4
            return _tf32_value(sm[at // 4])

        out = []
        for j in range(len(acc)):
            row = 16 * warp + g + 8 * ((j % 4) // 2)
            col = 8 * (j // 4) + 2 * t + j % 2
            s = sum(a(row, k) * b(col, k) for k in range(8))
            out.append(np.float32((float(acc[j]) if accumulate else 0.0) + s))
        cuda.syncthreads()
        return tuple(out)

    @cuda.jit(device=True)
    def wgmma_tf32(sm, a0, a1, a2, a3, desc, acc):
        """The simulator's accumulating m64nNk8 product (N = 2 len(acc))."""
        return _emulate(sm, a0, a1, a2, a3, desc, acc, True)

    @cuda.jit(device=True)
    def wgmma_tf32_first(sm, a0, a1, a2, a3, desc, acc):
        """The simulator's m64nNk8 product that overwrites acc (its values unread)."""
        return _emulate(sm, a0, a1, a2, a3, desc, acc, False)
