"""float32 <-> bfloat16 on the GPU, two ways side by side: sm_90 PTX and numerics, no GPU.

    python bench/labs/bf16_convert_ptx.py [--json PATH]

Variants of each direction, as one-element-per-thread kernels:
- intrinsics: numba.cuda.bf16 (float32_to_bfloat16_rn, bfloat16_to_float32), the values
  kept as uint16 bits through bfloat16_as_uint16 / uint16_as_bfloat16;
- shifts: the bits of the float32 as uint32, rounded to nearest even by an add of 0x7FFF
  plus the lowest kept bit, then shifted; NaN kept a quiet NaN (the add would carry a NaN
  with a small payload into infinity); widening is a shift left by 16;
- package: the shifts as the package writes them (euler.layer_math.bf16_round).

For each: PTX instructions of the kernel body, calls, and local-memory use (cvta.local:
a call's arguments passed through the stack). The shift variant's rounding is checked on
the host against torch.bfloat16 (round to nearest even) when torch is importable, over
random values, halfway cases, subnormals, infinities and NaN.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numba
import numpy as np
from numba import cuda

QUIET_NAN = 0x7FC0


def to_bf16_bits_host(x: np.ndarray) -> np.ndarray:
    """The shift variant's rounding, in NumPy: float32 (N,) -> bfloat16 bits uint16 (N,)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(QUIET_NAN), r)


def kernels() -> dict[str, tuple[object, tuple]]:
    """name -> (Python kernel, argument types)."""
    from numba.cuda import bf16, libdevice

    from euler.layer_math import bf16_round

    def narrow_intrinsics(out, x):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = bf16.bfloat16_as_uint16(bf16.float32_to_bfloat16_rn(x[i]))

    def narrow_shifts(out, x):
        i = cuda.grid(1)
        if i < x.size:
            u = np.uint32(libdevice.float_as_int(x[i]))
            r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            out[i] = np.uint16(QUIET_NAN) if x[i] != x[i] else np.uint16(r)

    def narrow_package(out, x):  # what the package's kernels call: layer_math.bf16_round
        i = cuda.grid(1)
        if i < x.size:
            out[i] = bf16_round(x[i])

    def widen_intrinsics(out, b):
        i = cuda.grid(1)
        if i < b.size:
            out[i] = bf16.bfloat16_to_float32(bf16.uint16_as_bfloat16(b[i]))

    def widen_shifts(out, b):
        i = cuda.grid(1)
        if i < b.size:
            out[i] = libdevice.int_as_float(np.int32(np.uint32(b[i]) << np.uint32(16)))

    to16 = (numba.uint16[::1], numba.float32[::1])
    to32 = (numba.float32[::1], numba.uint16[::1])
    return {
        "narrow_intrinsics": (narrow_intrinsics, to16),
        "narrow_shifts": (narrow_shifts, to16),
        "narrow_package": (narrow_package, to16),
        "widen_intrinsics": (widen_intrinsics, to32),
        "widen_shifts": (widen_shifts, to32),
    }


def ptx_stats(ptx: str) -> dict[str, int]:
    """Instructions (statements outside declarations), calls, and uses of the .local state
    space (the stack a call's arguments go through)."""
    statements = [st.strip() for st in ptx.split(";")]
    body = [st for st in statements if st and not st.lstrip("{}\n\t ").startswith((".", "//"))]
    return {
        "instructions": len(body),
        "calls": len(re.findall(r"\bcall(\.uni)?\b", ptx)),
        "local_memory": len(re.findall(r"\.local\b", ptx)),
    }


def check_rounding() -> str:
    """The shift variant against torch.bfloat16, or why it was not checked."""
    try:
        import torch
    except ImportError:
        return "skipped: torch is not importable"
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 16).astype(np.float32) * np.float32(1e3)
    halfway = (np.arange(1 << 12, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-40, 3.4e38], np.float32)
    x = np.concatenate([x, halfway[np.isfinite(halfway)], specials])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = to_bf16_bits_host(x)
    bad = int((got != want).sum())
    nan_ok = to_bf16_bits_host(np.array([np.nan], np.float32))[0] == QUIET_NAN
    return f"{x.size} values, {bad} differ from torch.bfloat16; NaN stays NaN: {bool(nan_ok)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import numba.cuda.dispatcher as dispatcher

    hopper = SimpleNamespace(compute_capability=(9, 0))
    dispatcher.get_current_device = lambda: hopper  # device functions ask for the device's cc
    result = {"ptx": {}, "rounding": check_rounding()}
    for name, (kernel, sig) in kernels().items():
        ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
        result["ptx"][name] = ptx_stats(ptx)
        print(f"{name:18s} {result['ptx'][name]}")
    print("rounding:", result["rounding"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
