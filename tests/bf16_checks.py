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

from types import SimpleNamespace

import numpy as np
from test_gpu_device import _f32, report, run_both

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


def check_rope_bf16(cpu, gpu, rng, s) -> None:
    """Forward: bf16 qkv rotated in place (cos, sin float32). Backward: float32 dqkv (dQ is
    added by float atomics) rotated into a bf16 out, v heads copied, dqkv left as it was. At
    the sizes' head size, and on 3 positions at the other path's: E = 16 (8 pairs a thread)
    where s.E takes the scalar path (E/2 % 8 != 0), else E = 6."""
    H, G, pos0 = s.H, s.G, 2
    for E, B, T in ((s.E, s.B, s.T), (6 if s.E % 16 == 0 else 16, 1, 3)):
        ang = np.arange(T + 3)[:, None] * 10000.0 ** (-np.arange(0, E, 2) / E)
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        shape = (B, T, (H + 2 * G) * E)
        run_both(cpu, gpu, "rope_forward", [_bf16(rng, *shape), cos, sin, H, G, E, pos0],
                 {"qkv": 0}, rtol=BF16_RTOL, atol=BF16_ATOL)  # fmt: skip
        dqkv, want = _f32(rng, *shape), np.zeros(shape, np.uint16)
        cpu.rope_backward(dqkv.copy(), cos, sin, H, G, E, pos0, out=want)
        d_dqkv, d_out = gpu.to_device(dqkv), gpu.to_device(np.zeros(shape, np.uint16))
        gpu.rope_backward(d_dqkv, gpu.to_device(cos), gpu.to_device(sin), H, G, E, pos0,
                          out=d_out)  # fmt: skip
        report(f"rope_backward.out(E={E})", gpu.to_host(d_out), want, BF16_RTOL, BF16_ATOL)
        assert np.array_equal(gpu.to_host(d_dqkv), dqkv), f"rope_backward(E={E}) wrote dqkv"


def check_cross_entropy_bf16(cpu, gpu, rng, s) -> None:
    """bf16 logits, float32 losses: the forward, and the forward-backward turning logits into
    bf16 dlogits in place. Rows of V (8 logits a 16-byte access where V % 8 == 0), and 6 rows
    of V - 3 (one logit a thread)."""
    scales = np.array([0.1, 0.37])
    for N, V in ((s.B * s.T, s.V), (6, s.V - 3)):
        targets = rng.integers(0, V, N).astype(np.int32)
        targets[1::5] = -1
        logits, losses = _bf16(rng, N, V, scale=4), np.zeros(N, np.float32)
        run_both(cpu, gpu, "cross_entropy_forward", [losses, logits, targets], {"losses": 0})
        want_losses, want_dlogits = losses.copy(), logits.copy()
        cpu.cross_entropy_forward_backward(want_losses, want_dlogits, targets, scales, 1)
        dev = [gpu.to_device(a) for a in (losses, logits, targets, scales)]
        gpu.cross_entropy_forward_backward(*dev, 1)
        report(f"cross_entropy_forward_backward.losses(V={V})", gpu.to_host(dev[0]), want_losses)
        report(f"cross_entropy_forward_backward.dlogits(V={V})", gpu.to_host(dev[1]),
               want_dlogits, BF16_RTOL, BF16_ATOL)  # fmt: skip


def check_adamw_bf16(cpu, gpu, rng, s) -> None:
    """AdamW with lowp: params, m, v as test_gpu_device.check_adamw checks them, and lowp
    (bf16) exactly the new params rounded to nearest even, written by the same kernel. P of
    4-element groups, not all in 8-element ones (16-byte float32 accesses, 8-byte bf16
    stores), and odd (the scalar kernel)."""
    hp = SimpleNamespace(grad_clip=1.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    hyper = np.array([3e-4, 1 - 0.9**7, 1 - 0.95**7])
    base = 8 * s.F + s.D
    for P in (base - base % 8 + 4, base | 1):
        params, grads = _f32(rng, P), _f32(rng, P, scale=0.1)
        m, v = _f32(rng, P, scale=0.01), np.abs(_f32(rng, P, scale=1e-4))
        dev = [gpu.to_device(a) for a in (params, grads, m, v)]
        lowp = gpu.to_device(np.zeros(P, np.uint16))
        want = cpu.adamw_step(params, grads, m, v, hp, hyper, P // 2)
        got = float(gpu.adamw_step(*dev, hp, gpu.to_device(hyper), P // 2, lowp=lowp))
        report(f"adamw.norm(P={P})", np.array(got), np.array(want), rtol=1e-9)
        for name, c, g in zip(
            ("params", "m", "v"), (params, m, v), (dev[0], dev[2], dev[3]), strict=True
        ):
            report(f"adamw.{name}(P={P})", gpu.to_host(g), c)
        new = gpu.to_host(dev[0])
        assert np.array_equal(gpu.to_host(lowp), to_bf16(new)), f"adamw.lowp(P={P})"


def check_swiglu_bf16(cpu, gpu, rng, s) -> None:
    """gu, h, dh and dgu all bf16: the forward and backward at the sizes' F (8 columns a
    16-byte access where F % 8 == 0) and, on s.T rows, at F + 2 (the element-by-element
    kernels)."""
    for N, F in ((s.B * s.T, s.F), (s.T, s.F + 2)):
        gu, dh = _bf16(rng, N, 2 * F, scale=3), _bf16(rng, N, F)
        run_both(cpu, gpu, "swiglu_forward", [np.zeros((N, F), np.uint16), gu], {"h": 0},
                 rtol=BF16_RTOL, atol=BF16_ATOL)  # fmt: skip
        # dg = dh u sig (1 + g (1 - sig)) cancels near g = -1.28: there the float32 results
        # differ by a few ulp of dh u (scale 3), not of dg
        run_both(cpu, gpu, "swiglu_backward", [np.zeros_like(gu), dh, gu], {"dgu": 0},
                 rtol=BF16_RTOL, atol=1e-5)  # fmt: skip


def check_embedding_bf16(cpu, gpu, rng, s) -> None:
    """The backward's bf16 dx (the residual gradient) scattered into float32 dwte: assigned
    at the sizes' D (8 columns a 16-byte load where D % 8 == 0), accumulated at D + 2 (one
    element a thread); the forward is float32 (check_embedding)."""
    N = s.B * s.T
    tokens = rng.integers(0, s.V, N).astype(np.int32)
    tokens[:3] = tokens[0]  # a repeated id: the backward must add, not overwrite
    for D, acc in ((s.D, False), (s.D + 2, True)):
        dx, dwte = _bf16(rng, N, D), _f32(rng, s.V, D)
        # float32 sums of exact bf16 terms, in an order of the atomics' own
        run_both(cpu, gpu, "embedding_backward", [dwte, dx, tokens, acc], {"dwte": 0})


def bf16_checks() -> list:
    """Every check_* function of this module, in name order."""
    return [f for name, f in sorted(globals().items()) if name.startswith("check_")]


BF16_CHECKS = bf16_checks()
