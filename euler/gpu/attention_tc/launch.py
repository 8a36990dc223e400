"""Generate, compile and launch the tensor-core kernels: once per TcOptions, cached by it.

The sources go through generated.compile_generated (written to a file named by their
digest, so Numba's disk cache serves the next process). Both kernels take their shared
memory at launch (shared_bytes: two buffers are over the 48 KB of a static array at E = 64;
attention.launch_dynamic raises the limit). The compiled kernels are cached for the
process; the backward's flag buffer is the caller's (GpuBackend keeps one per backend).
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import numpy as np
from numba import config, cuda, float32
from numba.cuda.cudadrv.driver import device_memset

from euler.gpu import attention
from euler.gpu.approx import LOG2E
from euler.gpu.async_copy import check_aligned
from euler.gpu.attention_tc.backward import dkv_source
from euler.gpu.attention_tc.forward import forward_source
from euler.gpu.attention_tc.fragments import SIM_RED, THREADS, TILE, layout
from euler.gpu.attention_tc.fragments_bf16 import BF16_HEAD_SIZES, layout_bf16
from euler.gpu.attention_tc.options import HEAD_SIZES, TcOptions
from euler.gpu.generated import compile_generated
from euler.precision import BF16, is_bf16

HEADER = """import math

from numba import cuda, float32, uint64

from euler.gpu.branchless import fmax, select
from euler.gpu.mma import ldmatrix_x4, mma_tf32, tf32, tf32_finite
from euler.gpu.reduce import FULL_MASK
from euler.gpu.async_copy import cp_async4, cp_async4_flat, cp_async16, cp_async16_flat, \
cp_async_commit, cp_async_wait
from euler.gpu.approx import exp2_approx
from euler.gpu.mma import tf32_operand
from euler.gpu.vector import atomic_add2, atomic_add2_flat, atomic_add4, atomic_add4_flat, \
load2_shared, load4_shared, store4_3d
from euler.gpu.flags import flag_raise, flag_read, flag_release
from euler.gpu.reduce import group_sum
from euler.gpu.vector import store4_flat
from euler.layer_math import softmax_grad"""
# the bf16 kernels' extra imports (TF32's module text stays as it was: the same digest)
HEADER_BF16 = (
    HEADER
    + """
from numba import uint16
from euler.gpu.mma import bf16x2_hi, bf16x2_lo, ldmatrix_x4_b16, ldmatrix_x4_trans_b16, \
mma_bf16, pack_bf16x2
from euler.gpu.attention_tc.bf16_io import cp_async16_bf16, cp_async16_bf16_flat, \
load_words4_shared, store_word_shared, store_words4_3d"""
)


class TcKernels(NamedTuple):
    """The compiled kernels of one TcOptions."""

    forward: object  # forward_tc_kernel's dispatcher
    dkv: object  # backward_dkv_tc_kernel's


def supports(E: int, bf16: bool = False) -> bool:
    """Head sizes these kernels are generated for (E divides the 128 threads' copies; in
    bf16 a multiple of the mma's k = 16)."""
    return E in (BF16_HEAD_SIZES if bf16 else HEAD_SIZES)


def shared_bytes(options: TcOptions) -> dict[str, int]:
    """Dynamic shared memory of each kernel ("forward", "dkv") in bytes."""
    extra = SIM_RED if options.simulator else 0
    sizes = (layout_bf16 if options.bf16 else layout)(options.head_size)
    return {k: 4 * (v + extra) for k, v in sizes.items()}


def sources(options: TcOptions) -> dict[str, str]:
    """The generated source of each kernel, by kernel name (forward_tc_kernel,
    backward_dkv_tc_kernel); HEADER holds their imports."""
    return {
        "forward_tc_kernel": forward_source(options),
        "backward_dkv_tc_kernel": dkv_source(options),
    }


def compile_kernel(name: str, src: str, bf16: bool = False):
    """The dispatcher of kernel `name` of generated source src (sources' or an edit of it),
    after HEADER (HEADER_BF16 for a bf16 kernel's)."""
    return compile_generated(name, src, HEADER_BF16 if bf16 else HEADER)


@cache
def kernels(options: TcOptions) -> TcKernels:
    """The kernels of options, generated and compiled on first use and kept for the process
    (compiled code is a pure function of the frozen options; device buffers are not, so
    none is kept here)."""
    if options.simulator != bool(config.ENABLE_CUDASIM):
        raise ValueError(f"TcOptions.simulator: {options.simulator}, but numba.cuda's is not")
    built = (compile_kernel(n, s, options.bf16) for n, s in sources(options).items())
    return TcKernels(*built)


def _options(E: int, options: TcOptions | None, qkv) -> TcOptions:
    """options (TcOptions(E) by default, bf16 if qkv is), checked against E and qkv."""
    bf16 = is_bf16(qkv)
    if options is None:
        return TcOptions(E, bf16=bf16)
    if options.head_size != E:
        raise ValueError(f"TcOptions.head_size: {options.head_size}, but E is {E}")
    if options.bf16 != bf16:
        raise ValueError(f"TcOptions.bf16: {options.bf16}, but qkv is {np.dtype(qkv.dtype)}")
    return options


def _check_dtypes(options: TcOptions, **arrays) -> None:
    """ValueError naming each array whose dtype is not the precision's: qkv, out, dout bf16
    (uint16 bits) in bf16, every other one float32."""
    storage = {"qkv", "out", "dout"} if options.bf16 else set()
    wrong = [
        f"{name} is {np.dtype(a.dtype)}, not {'bf16 (uint16)' if name in storage else 'float32'}"
        for name, a in arrays.items()
        if np.dtype(a.dtype) != (BF16 if name in storage else np.float32)
    ]
    if wrong:
        precision = "bf16" if options.bf16 else "float32"
        raise ValueError(f"attention_tc ({precision} qkv): {'; '.join(wrong)}")


def _check_rows(*arrays) -> None:
    """check_aligned for float32 arrays; for bf16 ones, rows of 8 elements (16 bytes)."""
    for a in arrays:
        if is_bf16(a) and a.shape[2] % 8:
            raise ValueError(f"cp.async: a bf16 array of shape {a.shape} has rows of a "
                             "whole number of 16 bytes only with C a multiple of 8")  # fmt: skip
    check_aligned(*arrays)


def _check(qkv, H: int, G: int, E: int) -> tuple[int, int]:
    B, Tn, C = qkv.shape
    if C != (H + 2 * G) * E or H % G:
        raise ValueError(f"qkv: (B, T, (H + 2G) E) with G | H, not {qkv.shape} at {H=} {G=} {E=}")
    return B, Tn


def attention_forward(
    out, lse, qkv, H: int, G: int, E: int, stream=0, options: TcOptions | None = None
) -> None:
    """out (B, T, H E), lse (B, H, T) natural-log logsumexp of the scaled scores, assigned,
    from qkv (B, T, (H + 2G) E); float32, 16-byte aligned rows. The bf16 kernels run for a
    bf16 qkv (uint16 bits); out is then bf16 too, lse float32."""
    options = _options(E, options, qkv)
    _check_dtypes(options, qkv=qkv, out=out, lse=lse)
    B, Tn = _check(qkv, H, G, E)
    if out.shape != (B, Tn, H * E) or lse.shape != (B, H, Tn):
        raise ValueError(f"out, lse: {(B, Tn, H * E)}, {(B, H, Tn)}, not {out.shape}, {lse.shape}")
    _check_rows(qkv, *((out,) if options.bf16 else ()))
    # the forward's exponentials are 2^x: log2(e) rides on Q's scale
    scale = float32(LOG2E / math.sqrt(E))
    grid = (B * H, (Tn + TILE - 1) // TILE)  # heads on the fast axis, heaviest tiles first
    nbytes = shared_bytes(options)["forward"]
    attention.launch_dynamic(kernels(options).forward, grid, THREADS, stream, nbytes,
                             out, lse, qkv, H, G, scale)  # fmt: skip


def flag_count(B: int, H: int, T: int) -> int:
    """Elements of attention_backward's flags: one a (b, h, 64-query tile) unit."""
    return B * H * ((T + TILE - 1) // TILE)


def attention_backward(
    dqkv, dout, qkv, out, lse, H: int, G: int, E: int, dsum, stream=0,
    options: TcOptions | None = None, flags=None,
) -> None:  # fmt: skip
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    dsum (B, H, T) is scratch for D_i = rowsum(dO * O); the kv heads' gradients sum over
    the query heads of their group. Same math as attention.attention_backward. T a multiple
    of 64: the dkv grid's first row prepares dsum and dQ's zeros (prep.py), each unit's
    behind a flag in flags, (flag_count(B, H, T),) int32 scratch that this call zeroes on
    stream (None: one allocated for this call, which a captured step could not do;
    GpuBackend passes its own). Else attention.backward_prep prepares them, before it, and
    no flag is read. bf16 qkv: dout and out bf16 too, dqkv, lse and dsum float32 (dQ's
    atomic adds are float), and T a multiple of 64 (the prep blocks alone read bf16 dO and
    O).
    """
    options = _options(E, options, qkv)
    _check_dtypes(options, dqkv=dqkv, dout=dout, qkv=qkv, out=out, lse=lse, dsum=dsum)
    B, Tn = _check(qkv, H, G, E)
    if dqkv.shape != qkv.shape:
        raise ValueError(f"dqkv: {qkv.shape} (qkv's), not {dqkv.shape}")
    if dout.shape != (B, Tn, H * E) or out.shape != (B, Tn, H * E):
        raise ValueError(f"dout, out: {(B, Tn, H * E)}, not {dout.shape}, {out.shape}")
    if lse.shape != (B, H, Tn) or dsum.shape != (B, H, Tn):
        raise ValueError(f"lse, dsum: {(B, H, Tn)}, not {lse.shape}, {dsum.shape}")
    _check_rows(qkv, dout)
    scale = float32(1.0 / math.sqrt(E))
    nt = (Tn + TILE - 1) // TILE
    fused = Tn % TILE == 0  # whole units: no two share a cache line of dsum
    if options.bf16 and not fused:
        raise ValueError(f"attention_tc backward in bf16: T a multiple of {TILE}, not {Tn}")
    n = flag_count(B, H, Tn)
    if flags is None:
        flags = cuda.device_array(n, np.int32)
    elif flags.shape != (n,) or np.dtype(flags.dtype) != np.int32:
        raise ValueError(f"flags: ({n},) int32, not {flags.shape} {np.dtype(flags.dtype)}")
    if fused:
        _check_rows(out)
        _zero_flags(flags, stream)
    else:  # the kernel reads no flag: none is zeroed
        attention.backward_prep(dqkv, dsum, dout, out, H, E, stream)
    grid = (B * G, nt + int(fused))  # the prep blocks' row first, then the heaviest tiles
    args = (dqkv, dsum, dout, qkv, lse, H, G, scale, out, flags, int(fused))
    nbytes = shared_bytes(options)["dkv"]
    attention.launch_dynamic(kernels(options).dkv, grid, THREADS, stream, nbytes, *args)


def _zero_flags(flags, stream) -> None:
    """flags (n,) int32 = 0 on stream (the simulator has no memset: a host copy there)."""
    if config.ENABLE_CUDASIM:
        flags.copy_to_device(np.zeros(flags.shape, np.int32), stream=stream)
    else:
        device_memset(flags, 0, 4 * flags.shape[0], stream)
