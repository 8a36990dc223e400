"""select(cond, a, b): `a if cond else b` without a branch in Numba's IR.

The generated attention kernels have a hundred or more conditional assignments (rows past
the sequence end staged as zeros, the causal mask on the diagonal tile). Written as Python
conditionals each one splits a basic block, and Numba's SSA and liveness passes, which
grow with blocks times variables, spent most of a kernel's 45 seconds of compile time on
those blocks; NVVM turned them back into selects anyway. This intrinsic is one LLVM
`select` instruction, so the kernel body stays one block per loop level.
In the CUDA simulator it is the conditional expression.

fmax(a, b) is the larger of two float32 (libdevice's fmaxf: one max.f32, FMNMX in SASS), where
max() is a compare and a select; a NaN operand gives the other.
"""

from __future__ import annotations

from numba import cuda, types
from numba.core.errors import TypingError

from euler.gpu.reduce import SIMULATOR

if not SIMULATOR:
    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    @intrinsic
    def select(typingctx, cond, a, b):
        """a if cond else b, both evaluated; a and b of one number type after unification."""
        if not isinstance(cond, types.Boolean):
            raise TypingError(f"select: the condition must be a boolean, not {cond}")
        ty = typingctx.unify_types(a, b)
        if not isinstance(ty, types.Number):
            raise TypingError(f"select: {a} and {b} have no common number type")

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[1], sig.args[1], sig.return_type)
            y = context.cast(builder, args[2], sig.args[2], sig.return_type)
            return builder.select(args[0], x, y)

        return ty(cond, a, b), codegen

    @cuda.jit(device=True)
    def fmax(a, b):
        """The larger of float32 a and b (libdevice's fmaxf: max.f32)."""
        return libdevice.fmaxf(a, b)

else:

    @cuda.jit(device=True)
    def fmax(a, b):
        """The simulator's fmax: max()."""
        return max(a, b)

    @cuda.jit(device=True)
    def select(cond, a, b):
        """The simulator's select: the conditional expression."""
        return a if cond else b
