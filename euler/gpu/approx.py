"""exp_approx(x): e^x in two instructions, for kernels whose results are rounded anyway.

`math.exp` on float32 compiles to libdevice's __nv_expf: a range reduction around
`ex2.approx` (about nine instructions) that makes it correct to an ulp. The tensor-core
attention rounds every probability to TF32 (10 mantissa bits) before it is used, so the
hardware's `ex2.approx.ftz.f32` of x log2(e) (relative error about 2^-22, -inf -> +0)
loses nothing there, and a 64 x 64 score tile takes 4,096 of them. Written as an
intrinsic, not through `fastmath=True`, whose no-infinities flag would let LLVM fold
away the -inf of the causal mask. exp2_approx(x) is 2^x, the instruction alone, for
kernels that fold log2(e) into their operands. In the CUDA simulator they are math.exp and
2.0 ** x.
"""

from __future__ import annotations

import math

from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR

LOG2E = 1.0 / math.log(2.0)

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def _ex2(builder, x):
        f32 = ir.FloatType()
        ex2 = ir.InlineAsm(ir.FunctionType(f32, [f32]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
        return builder.call(ex2, [x])

    @intrinsic
    def exp_approx(typingctx, x):
        """e^x (float32) as ex2.approx.ftz.f32(x log2 e)."""
        if x != types.float32:
            raise TypingError(f"exp_approx takes a float32, not {x}")

        def codegen(context, builder, sig, args):
            return _ex2(builder, builder.fmul(args[0], ir.Constant(ir.FloatType(), LOG2E)))

        return types.float32(types.float32), codegen

    @intrinsic
    def exp2_approx(typingctx, x):
        """2^x (float32) as ex2.approx.ftz.f32(x)."""
        if x != types.float32:
            raise TypingError(f"exp2_approx takes a float32, not {x}")

        def codegen(context, builder, sig, args):
            return _ex2(builder, args[0])

        return types.float32(types.float32), codegen

else:

    @cuda.jit(device=True)
    def exp_approx(x):
        """The simulator's exp_approx: math.exp."""
        return math.exp(x)

    @cuda.jit(device=True)
    def exp2_approx(x):
        """The simulator's exp2_approx: 2.0 ** x."""
        return 2.0**x
