"""The attention kernels as text, for reading: what the GPU compiles, no GPU needed.

The tensor-core attention kernels are Python source written by a generator (their register
tiles must be scalars, so the loops are written out) and compiled per head size. This
module returns, for each of their precisions and head sizes, the exact module text that
generated.compile_generated writes and imports on a GPU (the device's source, never the
CUDA simulator's):

- tf32: the tensor-core kernels on mma.sync m16n8k8 (attention_tc/, the default), E in 8,
  16, 32, 64;
- bf16: the same generator on mma.sync m16n8k16 bf16 (`--precision bf16`), E in 16, 32, 64.

Each has a forward and a backward (dkv) kernel. docs/kernels/ holds every one of them,
written by `euler kernels write docs/kernels`; tests/test_kernel_sources.py checks that the
generator still writes them byte for byte, so a change to a kernel shows in review.
`euler kernels show attention --precision bf16 --head-size 64` prints one.

fp32 (`--exact-attention`, `--precision fp32`) is not generated: it is the plain file
euler/gpu/attention.py, one source for every head size, which `readable_source` returns.
"""

from __future__ import annotations

from pathlib import Path

from euler.gpu import attention_tc
from euler.gpu.generated import module_text

GENERATED = ("tf32", "bf16")  # the precisions whose attention kernels are generated
PRECISIONS = ("fp32", *GENERATED)
KERNELS = ("forward", "backward")


def readable_source() -> tuple[str, str]:
    """(path relative to the repository, text) of the fp32 attention kernels' plain file."""
    path = Path(__file__).with_name("attention.py")
    return f"euler/gpu/{path.name}", path.read_text(encoding="utf-8")


def head_sizes(precision: str) -> tuple[int, ...]:
    """The head sizes E the kernels of a generated `precision` are generated for."""
    if precision == "tf32":
        return attention_tc.HEAD_SIZES
    if precision == "bf16":
        return attention_tc.BF16_HEAD_SIZES
    raise ValueError(f"precision: one of {', '.join(GENERATED)}, not {precision!r}")


def attention_modules(precision: str, head_size: int) -> dict[str, str]:
    """{"forward": text, "backward": text}: the modules compiled for attention at `precision`
    and head size E, as compile_generated writes them."""
    if head_size not in head_sizes(precision):
        raise ValueError(
            f"head size: one of {', '.join(map(str, head_sizes(precision)))} at {precision}, "
            f"not {head_size}"
        )
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
        for precision in GENERATED
        for E in head_sizes(precision)
        for kernel, text in attention_modules(precision, E).items()
    }
