"""Precisions (--precision fp32, tf32, bf16), bfloat16 storage, and which tensors are bf16.

bfloat16 values are stored as their 16 bits in uint16 arrays (`BF16`) on both backends:
NumPy has no bfloat16, and the GPU kernels move the bits and widen them by a shift. A
backend method reads the dtype of each array it is given: float32 arrays are fp32 tensors,
BF16 arrays bf16 tensors, widened to float32 for the arithmetic and rounded to nearest even
when stored (`to_bf16`; the same rounding as `euler.layer_math.bf16_round` in kernels).

`BF16_TENSORS` is the one table of what is bf16 under --precision bf16 (docs/gpu.md shows
it; a test keeps the two equal). Everything it does not name stays float32: the master
weights, their gradients and AdamW's moments, the residual stream, the losses, the softmax
statistics (lse) and RMSNorm's rstd.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from euler.errors import EulerError

PRECISIONS = ("fp32", "tf32", "bf16")
BF16 = np.dtype(np.uint16)  # the storage dtype of a bf16 tensor: its bits
QUIET_NAN = 0x7FC0  # what every NaN rounds to
BF16_MIN_CAPABILITY = (8, 0)  # bf16 tensor-core products and conversions: Ampere and later
BF16_GPU_T_MULTIPLE = 64  # the GPU's bf16 attention backward takes whole 64-row tiles

# name (an Activations buffer, or a parameter copy), why it is bf16
BF16_TENSORS: tuple[tuple[str, str], ...] = (
    ("params_lp", "weight copies the products read; AdamW writes them beside the fp32 masters"),
    ("xn1", "attention norm output: feeds the qkv product and its weight gradient"),
    ("qkv", "product output, RoPE in place; attention's Q, K, V operands"),
    ("att", "attention output: feeds the output projection and its weight gradient"),
    ("xn2", "MLP norm output: feeds the gate and up product and its weight gradient"),
    ("gu", "product output; SwiGLU's input, saved for its backward"),
    ("h", "SwiGLU output: feeds the down projection and its weight gradient"),
    ("xf", "final norm output: feeds the heads' products and their weight gradients"),
    ("logits", "product output; cross-entropy turns it into dlogits in place, which feed "
               "two products"),
    ("dx", "the residual stream's gradient (as llm.c keeps it): feeds the dX and dW "
           "products of the layer below"),
    ("zero_bt_d", "the zero residual gradient the final norm's backward adds"),
    ("datt", "product output: attention backward's dO operand"),
    ("dqkv_lp", "RoPE backward's output: feeds the qkv dX and dW products"),
    ("dh", "product output: SwiGLU backward's input"),
    ("dgu", "SwiGLU backward's output: feeds the gate and up dX and dW products"),
)  # fmt: skip
BF16_NAMES = frozenset(name for name, _ in BF16_TENSORS)
# what stays float32 under bf16, and why (docs/gpu.md's table lists both)
FP32_TENSORS: tuple[tuple[str, str], ...] = (
    ("params, grads, m, v", "master weights, their gradients and AdamW's moments: an update "
                            "of lr x 1e-3 would vanish in bf16's 8 bits"),
    ("x, xmid", "the residual stream: each layer adds a small update to it"),
    ("rstd1, rstd2, rstdf", "RMSNorm's saved 1/rms (its sums accumulate in float32)"),
    ("lse", "attention's log-sum-exp, the softmax statistic the backward rebuilds P from"),
    ("losses", "per-token cross-entropy; summed in float64"),
    ("dxn, dxf", "dX products' outputs into RMSNorm's backward (dxf sums the K heads)"),
    ("dqkv", "attention backward's output: dQ is added by float32 atomics"),
)  # fmt: skip


def tensor_table() -> str:
    """The Markdown table of what is bf16 and what stays float32 (docs/gpu.md holds it)."""
    rows = ["| tensor | under --precision bf16 | why |", "|---|---|---|"]
    rows += [f"| `{name}` | bf16 | {why} |" for name, why in BF16_TENSORS]
    rows += [f"| {', '.join(f'`{n}`' for n in names.split(', '))} | float32 | {why} |"
             for names, why in FP32_TENSORS]  # fmt: skip
    return "\n".join(rows)


# The one statement of which precisions each command accepts on each device, its default
# first. Every --precision refusal and help text is worded from it (precision_error,
# precision_help), so no command suggests a precision that another refuses on that device.
ACCEPTED: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {"cpu": ("fp32", "bf16"), "cuda": ("tf32", "fp32", "bf16")},
    "sft": {"cpu": ("fp32", "bf16"), "cuda": ("tf32", "fp32", "bf16")},
    "bench": {"cpu": ("fp32", "bf16"), "cuda": ("tf32", "fp32", "bf16")},
    "chat": {"cpu": ("fp32",), "cuda": ("tf32", "fp32", "bf16")},
    "eval": {"cpu": ("fp32",), "cuda": ("tf32", "fp32", "bf16")},
    "serve": {"cpu": ("fp32",), "cuda": ("fp32",)},
}
DEVICES = ("cpu", "cuda")
MEANING = {
    "fp32": "exact float32 products",
    "tf32": "products on TF32 tensor cores",
    "bf16": "bf16 products, attention and activations with fp32 master weights",
}


def _why_not(command: str, device: str, precision: str) -> str:
    """Why `command` on `device` refuses precision (which ACCEPTED leaves out there)."""
    if device == "cpu" and precision == "tf32":
        return "the CPU has no TF32 products"
    if command == "serve":
        return "the server's batch decoder computes in fp32"
    if device == "cpu":
        return "the CPU's KV-cache decoder runs in fp32; bf16 is emulated for training only"
    return f"euler {command} does not run {precision} on {device}"


def _choices(names: Sequence[str]) -> str:
    """'fp32 only', 'fp32 or bf16', 'tf32, fp32 or bf16'."""
    if len(names) == 1:
        return f"{names[0]} only"
    return f"{', '.join(names[:-1])} or {names[-1]}"


def precision_error(command: str, device: str, precision: str) -> EulerError:
    """The one-line refusal of --precision for command on device, from ACCEPTED: what it
    takes there, why not this one, and where this one runs (the same command elsewhere)."""
    takes = ACCEPTED[command][device]
    msg = (f"--precision {precision}: euler {command} --device {device} takes "
           f"{_choices(takes)} ({_why_not(command, device, precision)})")  # fmt: skip
    elsewhere = [d for d in DEVICES if d != device and precision in ACCEPTED[command][d]]
    if elsewhere:
        msg += f"; {precision} runs with --device {elsewhere[0]}"
    return EulerError(msg)


def precision_help(command: str) -> str:
    """--precision's help text for command, from ACCEPTED and MEANING."""
    per_device = "; ".join(f"{_choices(ACCEPTED[command][d])} on {d}" for d in DEVICES)
    used = [p for p in PRECISIONS if any(p in ACCEPTED[command][d] for d in DEVICES)]
    meanings = "; ".join(f"{p}: {MEANING[p]}" for p in used)
    defaults = ", ".join(f"{ACCEPTED[command][d][0]} on {d}" for d in DEVICES)
    emulated = " (bf16 on cpu: emulated, slow)" if "bf16" in ACCEPTED[command]["cpu"] else ""
    return f"{per_device}{emulated}. {meanings}. Default: {defaults}."


def accepted_table() -> str:
    """The Markdown table of ACCEPTED (the README holds it; a test keeps the two equal)."""
    rows = ["| command | on cpu | on cuda |", "|---|---|---|"]
    for command, by_device in ACCEPTED.items():
        cells = [", ".join(f"**{p}**" if i == 0 else p for i, p in enumerate(by_device[d]))
                 for d in DEVICES]  # fmt: skip
        rows.append(f"| `euler {command}` | {' | '.join(cells)} |")
    return "\n".join(rows)


def check_precision(precision: str, flag: str = "--precision") -> str:
    """precision itself, or an EulerError listing the choices."""
    if precision not in PRECISIONS:
        raise EulerError(f"{flag}: {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def resolve_precision(device: str, precision: str | None, command: str = "train") -> str:
    """The precision `euler command` on device computes in: None is ACCEPTED's default
    there; an unknown precision, or one the command refuses on device, an EulerError
    naming --precision (precision_error)."""
    if device not in DEVICES:
        raise EulerError(f"--device must be cpu or cuda, got {device!r}")
    takes = ACCEPTED[command][device]
    if precision is None:
        return takes[0]
    check_precision(precision)
    if precision not in takes:
        raise precision_error(command, device, precision)
    return precision


def storage_dtype(precision: str, name: str, dtype=np.float32) -> np.dtype:
    """The dtype of buffer `name` under precision: BF16 where bf16 stores it, else dtype."""
    return BF16 if precision == "bf16" and name in BF16_NAMES else np.dtype(dtype)


def is_bf16(a) -> bool:
    """Whether array a (host or device) holds bf16 bits."""
    return np.dtype(a.dtype) == BF16


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 (any shape) -> bf16 bits (uint16), round to nearest even; NaN -> quiet NaN."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(QUIET_NAN), bits)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16, any shape) -> float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest bf16, as float32 (the value a bf16 store keeps)."""
    return from_bf16(to_bf16(x))


def host_values(a: np.ndarray) -> np.ndarray:
    """The values of a host array: bf16 bits widened to float32, any other dtype as it is
    (a float64 model's stays float64)."""
    return from_bf16(a) if is_bf16(a) else a


def as_float32(a: np.ndarray) -> np.ndarray:
    """A host array as float32 values: bf16 bits widened, anything else cast."""
    return from_bf16(a) if is_bf16(a) else np.asarray(a, dtype=np.float32)


def check_bf16_sequence(device: str, precision: str, T: int, flag: str = "--seq-len") -> None:
    """EulerError naming the flag where a bf16 GPU run's sequence length T is not a multiple
    of BF16_GPU_T_MULTIPLE (training needs attention's backward)."""
    if device == "cuda" and precision == "bf16" and T % BF16_GPU_T_MULTIPLE:
        raise EulerError(
            f"{flag} {T}: bf16 training on cuda takes sequences of a multiple of "
            f"{BF16_GPU_T_MULTIPLE} tokens (attention's backward tiles); give one, or "
            "--precision tf32"
        )


def check_bf16_capability(capability: Sequence[int], name: str = "this GPU") -> None:
    """EulerError naming the compute capability and the fallback, below BF16_MIN_CAPABILITY."""
    if tuple(capability) < BF16_MIN_CAPABILITY:
        major, minor = capability
        need = ".".join(map(str, BF16_MIN_CAPABILITY))
        raise EulerError(
            f"--precision bf16: {name} has compute capability {major}.{minor}; bf16 needs "
            f"{need} or later (Ampere); use --precision tf32 or fp32"
        )
