"""What the tensor-core attention's generated source depends on: TcOptions.

One options object is one pair of generated kernels (launch.kernels caches them by it): the
head size, the operands' precision (TF32 or bf16), whether the source is for the CUDA
simulator, and the shape of the dkv grid's prep blocks (prep.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from numba import config

HEAD_SIZES = (8, 16, 32, 64)  # E divides the 128 threads' 16-byte copies of a 64-row tile


@dataclass(frozen=True)
class TcOptions:
    """The generator's inputs (frozen: the instance is the compile cache's key).

    head_size: E, one of HEAD_SIZES.
    simulator: source for the CUDA simulator (no warp shuffles: quad reductions go through
        shared memory; no alignment on the shared array); by default whether
        NUMBA_ENABLE_CUDASIM is on when the options are made.
    prep_span: (batch element, kv head) pairs a prep block serves; the other blocks of the
        prep row exit at once.
    prep_stages: a prep block's units in shared memory at once: two in flight while one is
        summed, so at least 3.
    prep_flag_every: units whose flags a prep block's thread 0 raises after one release
        fence (a power of two; the first two units' at once).
    bf16: bf16 storage and operands (mma m16n8k16 bf16, fragments_bf16.py): qkv, out and
        dout bf16, lse, dsum and dqkv float32; head_size then one of BF16_HEAD_SIZES.
    """

    head_size: int
    simulator: bool = field(default_factory=lambda: bool(config.ENABLE_CUDASIM))
    prep_span: int = 2
    prep_stages: int = 3
    prep_flag_every: int = 2
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.head_size not in HEAD_SIZES:
            raise ValueError(f"TcOptions.head_size: one of {HEAD_SIZES}, not {self.head_size}")
        if self.prep_span < 1:
            raise ValueError(f"TcOptions.prep_span: at least 1, not {self.prep_span}")
        if self.prep_stages < 3:
            raise ValueError(f"TcOptions.prep_stages: at least 3, not {self.prep_stages}")
        every = self.prep_flag_every
        if every < 1 or every & (every - 1):
            raise ValueError(f"TcOptions.prep_flag_every: a power of two, not {every}")
        # (these import this module)
        from euler.gpu.attention_tc.fragments import THREADS, TILE, layout
        from euler.gpu.attention_tc.fragments_bf16 import BF16_HEAD_SIZES, layout_bf16

        if self.bf16 and self.head_size not in BF16_HEAD_SIZES:
            raise ValueError(
                f"TcOptions.head_size: one of {BF16_HEAD_SIZES} in bf16, not {self.head_size}"
            )
        unit = TILE * self.head_size * (1 if self.bf16 else 2)  # floats of a prep unit's dO, O
        dkv = (layout_bf16 if self.bf16 else layout)(self.head_size)["dkv"]
        if self.prep_stages * unit + THREADS > dkv:
            raise ValueError(
                f"TcOptions.prep_stages: {self.prep_stages} overflow dkv's shared memory"
            )
