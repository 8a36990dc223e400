"""bf16 layer checks: each backend method on bf16 tensors against the CPU's emulation.

Every check takes (cpu, gpu, rng, sizes) like test_gpu_device.LAYER_CHECKS and passes each
argument in the dtype the model gives it under --precision bf16 (euler.precision.BF16_TENSORS:
bf16 as uint16 bits, the rest float32). The CPU backend emulates bf16 (widen, float32
kernel, round each bf16 output once), so a GPU kernel that reads, computes and stores as
it should agrees with it to float32 rounding before the final bf16 store: a bf16 output
may then differ by one bf16 step (2^-8 relative, the 8-bit significand) where the two
float32 results fall on either side of a rounding boundary, hence BF16_RTOL.

test_gpu_sim.py runs every check in BF16_CHECKS (each function named check_*) in the CUDA
simulator on tiny shapes; test_gpu_device.py on a real GPU at larger ones.
"""

from __future__ import annotations

import numpy as np
from test_gpu_device import _f32, run_both

from euler.precision import to_bf16

BF16_RTOL = 2.0**-7  # one step of bf16's 8-bit significand, anywhere in a binade
BF16_ATOL = 1e-30  # only exact zeros need an absolute allowance


def _bf16(rng, *shape, scale=1.0) -> np.ndarray:
    """Random bf16 bits (uint16) of N(0, scale^2) values."""
    return to_bf16(_f32(rng, *shape, scale=scale))


def check_rmsnorm_bf16(cpu, gpu, rng, s) -> None:
    """Forward: x float32 (the residual stream) -> y bf16 (feeds a product), rstd float32.
    Backward: dy float32 (a dX product's output), dres and dx bf16 (the residual gradient,
    dx aliasing dres), x and w float32 -> dx bf16, dw float32."""
    N, D = s.B * s.T, s.D
    x, w = _f32(rng, N, D), _f32(rng, D, scale=0.5) + 1
    y, rstd = np.zeros((N, D), np.uint16), np.zeros(N, np.float32)
    run_both(cpu, gpu, "rmsnorm_forward", [y, rstd, x, w, 1e-5], {"y": 0, "rstd": 1},
             rtol=BF16_RTOL, atol=BF16_ATOL)  # fmt: skip
    r = (1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5)).astype(np.float32)
    for acc in (False, True):
        dx, dy, dw = _bf16(rng, N, D), _f32(rng, N, D), _f32(rng, D)
        args = [dx, dw, dy, dx, x, w, r, acc]
        run_both(cpu, gpu, "rmsnorm_backward", args, {"dx": 0}, rtol=BF16_RTOL, atol=BF16_ATOL)
        run_both(cpu, gpu, "rmsnorm_backward", args, {"dw": 1}, atol=1e-5)


def bf16_checks() -> list:
    """Every check_* function of this module, in name order."""
    return [f for name, f in sorted(globals().items()) if name.startswith("check_")]


BF16_CHECKS = bf16_checks()
