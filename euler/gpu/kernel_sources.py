"""The generated attention kernels as text, for reading: what the GPU compiles, no GPU needed.

The fast attention kernels are Python source written by a generator (their register tiles
must be scalars, so the loops are written out) and compiled per head size. This module
returns, for each precision and head size, the exact module text that
generated.compile_generated writes and imports on a GPU (the device's source, never the
CUDA simulator's):

- fp32: the exact FlashAttention-2 on CUDA cores (attention_tiles.py, `--exact-attention`
  or `--precision fp32`), E in 8, 16, 32, 64;
- tf32: the tensor-core kernels on mma.sync m16n8k8 (attention_tc/, the default), E in 8,
  16, 32, 64;
- bf16: the same generator on mma.sync m16n8k16 bf16 (`--precision bf16`), E in 16, 32, 64.

Each has a forward and a backward (dkv) kernel. docs/kernels/ holds every one of them,
written by `euler kernels write docs/kernels`; tests/test_kernel_sources.py checks that the
generator still writes them byte for byte, so a change to a kernel shows in review.
`euler kernels show attention --precision bf16 --head-size 64` prints one.
"""

from __future__ import annotations

from euler.gpu import attention_tc, attention_tiles
from euler.gpu.generated import module_text

PRECISIONS = ("fp32", "tf32", "bf16")
KERNELS = ("forward", "backward")


def head_sizes(precision: str) -> tuple[int, ...]:
    """The head sizes E the kernels of `precision` are generated for."""
    if precision == "fp32":
        return tuple(E for E in (8, 16, 32, 64) if attention_tiles.supports(E))
    if precision == "tf32":
        return attention_tc.HEAD_SIZES
    if precision == "bf16":
        return attention_tc.BF16_HEAD_SIZES
    raise ValueError(f"precision: one of {', '.join(PRECISIONS)}, not {precision!r}")


def attention_modules(precision: str, head_size: int) -> dict[str, str]:
    """{"forward": text, "backward": text}: the modules compiled for attention at `precision`
    and head size E, as compile_generated writes them."""
    if head_size not in head_sizes(precision):
        raise ValueError(
            f"head size: one of {', '.join(map(str, head_sizes(precision)))} at {precision}, "
            f"not {head_size}"
        )
    if precision == "fp32":
        if attention_tiles.SIMULATOR:
            raise ValueError("the exact kernels' device source: not under NUMBA_ENABLE_CUDASIM")
        sources, header = attention_tiles.sources(head_size), attention_tiles.HEADER
    else:
        bf16 = precision == "bf16"
        options = attention_tc.TcOptions(head_size, simulator=False, bf16=bf16)
        sources = attention_tc.sources(options)
        header = attention_tc.HEADER_BF16 if bf16 else attention_tc.HEADER
    (forward,) = (src for name, src in sources.items() if name.startswith("forward"))
    (backward,) = (src for name, src in sources.items() if name.startswith("backward_dkv"))
    return {"forward": module_text(forward, header), "backward": module_text(backward, header)}


def file_name(precision: str, head_size: int, kernel: str) -> str:
    """The name of a kernel's file in docs/kernels/."""
    return f"attention_{precision}_e{head_size}_{kernel}.py"


def all_attention_modules() -> dict[str, str]:
    """Every generated attention module, by its file name in docs/kernels/."""
    return {
        file_name(precision, E, kernel): text
        for precision in PRECISIONS
        for E in head_sizes(precision)
        for kernel, text in attention_modules(precision, E).items()
    }
