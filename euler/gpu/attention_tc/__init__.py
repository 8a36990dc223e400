"""Causal grouped-query FlashAttention on TF32 tensor cores (mma.sync m16n8k8, see mma.py).

Same interface, layouts and results (to TF32 rounding) as attention.attention_forward and
attention_backward: qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query
head h reads kv head h // (H / G); lse (B, H, T) is the natural-log logsumexp of the scaled
scores. Operands are rounded to TF32 (10 mantissa bits) as they are loaded into fragments,
products accumulate in float32, softmax and its statistics stay in float32.

FlashAttention-2 structure, 128 threads (4 warps) per block, 64-row tiles, two kernels:

forward (forward.py): a block owns 64 query rows of one (b, h); per 64-key tile, S = Q K^T,
  the online softmax on the C fragments, O += P V.
backward (backward.py): a block owns 64 key rows of one kv head; per (query head, query
  tile) pair of its group, S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, and dQ
  += dS K added to dqkv by float atomics (nondeterministic sums). dsum and dQ's zeros come
  from prep blocks in the same grid, behind flags (prep.py).

Register tiles must be scalars (an array indexed in a loop would live in local memory), so
each kernel's source is generated with the fragment loops written out (fragments.py), once
per TcOptions (options.py: the head size E in 8, 16, 32, 64 and the target), and compiled
once (launch.py). Tiles move by cp.async into two buffers, each loop iteration computing on
one while the next tile lands in the other.

TcOptions(bf16=True) generates the same kernels on mma.sync m16n8k16 bf16 (fragments_bf16.py):
qkv, out and dout bf16 (uint16 bits), lse, dsum and dqkv float32; the launchers pick it when
qkv is bf16. Its head sizes are 16, 32 and 64, and its backward takes T a multiple of 64.
"""

from euler.gpu.attention_tc.fragments_bf16 import BF16_HEAD_SIZES
from euler.gpu.attention_tc.launch import (
    HEADER,
    HEADER_BF16,
    TcKernels,
    attention_backward,
    attention_forward,
    compile_kernel,
    flag_count,
    kernels,
    shared_bytes,
    sources,
    supports,
)
from euler.gpu.attention_tc.options import HEAD_SIZES, TcOptions

__all__ = [
    "BF16_HEAD_SIZES",
    "HEADER",
    "HEADER_BF16",
    "HEAD_SIZES",
    "TcKernels",
    "TcOptions",
    "attention_backward",
    "attention_forward",
    "compile_kernel",
    "flag_count",
    "kernels",
    "shared_bytes",
    "sources",
    "supports",
]
