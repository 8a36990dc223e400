"""The engine's layer backward passes against the NumPy twins of tests/numpy_reference.py.

Each check runs one layer's backend calls (forward for the saved statistics, then backward)
on a backend of either kind from inputs of the given dtype, and compares the results with
the twin evaluated in float64 on the same inputs. test_engine_backward_reference.py runs
them on the CPU in float64; test_gpu_sim.py on the GPU backend in the CUDA simulator in
float32. `s` holds the sizes: B, T, D, F, V, H, G, E and K (heads of the cross-entropy).
"""

from __future__ import annotations

import numpy as np
from numpy_reference import (
    cross_entropy_backward,
    cross_entropy_loss,
    make_targets,
    naive_attention,
    naive_attention_backward,
    rmsnorm,
    rmsnorm_backward,
    rope_backward,
    swiglu_backward,
)

from euler.model.transformer import head_scales

ROPE_BASE = 100.0  # small, so that the angles of a short sequence cover a full turn


def assert_close(name: str, got, want: np.ndarray, rtol: float, atol: float) -> None:
    """got (any dtype) within atol + rtol |want| of the float64 want, which must not be ~0
    (a check of zeros against zeros could not fail)."""
    assert np.abs(want).max() > 1e-3, f"{name}: the expected values are all ~0"
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol,
                               err_msg=name)  # fmt: skip


def _randn(rng, dtype, *shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def check_rmsnorm_backward(be, rng, dtype, s, rtol, atol) -> None:
    """dx = dres + J^T dy (dx aliasing dres, as the model passes it) and dw, assigned and
    accumulated, from the rstd the engine's forward saved."""
    N, D, eps = s.B * s.T, s.D, 1e-2
    x, w = _randn(rng, dtype, N, D), _randn(rng, dtype, D, scale=0.5) + dtype(1.0)
    y, rstd = be.to_device(np.zeros((N, D), dtype)), be.to_device(np.zeros(N, dtype))
    dx_, w_ = be.to_device(x.copy()), be.to_device(w.copy())
    be.rmsnorm_forward(y, rstd, dx_, w_, eps)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert_close("rmsnorm.y", be.to_host(y), rmsnorm(x64, w64, eps), rtol, atol)
    for accumulate in (False, True):
        dy, dres, dw0 = _randn(rng, dtype, N, D), _randn(rng, dtype, N, D), _randn(rng, dtype, D)
        want_dx, want_dw = rmsnorm_backward(x64, w64, eps, dy.astype(np.float64))
        dx = be.to_device(dres.copy())  # dx aliases dres
        dw = be.to_device(dw0.copy())
        be.rmsnorm_backward(dx, dw, be.to_device(dy.copy()), dx, dx_, w_, rstd, accumulate)
        assert_close("rmsnorm.dx", be.to_host(dx), dres + want_dx, rtol, atol)
        want_dw = want_dw + (dw0 if accumulate else 0.0)
        assert_close(f"rmsnorm.dw(accumulate={accumulate})", be.to_host(dw), want_dw, rtol, atol)


def check_swiglu_backward(be, rng, dtype, s, rtol, atol) -> None:
    """dgu (N, 2F) = (dgate | dup) from dh (N, F) and the fused gate|up gu (N, 2F)."""
    N, F = s.B * s.T, s.F
    gu, dh = _randn(rng, dtype, N, 2 * F, scale=3), _randn(rng, dtype, N, F)
    dgu = be.to_device(np.full((N, 2 * F), np.nan, dtype))
    be.swiglu_backward(dgu, be.to_device(dh.copy()), be.to_device(gu.copy()))
    g64 = gu.astype(np.float64)
    dgate, dup = swiglu_backward(g64[:, :F], g64[:, F:], dh.astype(np.float64))
    assert_close("swiglu.dgu", be.to_host(dgu), np.concatenate([dgate, dup], axis=1), rtol, atol)


def check_rope_backward(be, rng, dtype, s, rtol, atol) -> None:
    """The q and k gradients of dqkv rotated back at positions pos0.., v's left alone."""
    B, T, H, G, E, pos0 = s.B, s.T, s.H, s.G, s.E, 3
    inv_freq = ROPE_BASE ** (-np.arange(0, E, 2, dtype=np.float64) / E)
    angle = np.arange(pos0 + T + 2)[:, None] * inv_freq[None, :]
    cos, sin = (be.to_device(f(angle).astype(dtype)) for f in (np.cos, np.sin))
    dqkv = _randn(rng, dtype, B, T, (H + 2 * G) * E)
    got = be.to_device(dqkv.copy())
    be.rope_backward(got, cos, sin, H, G, E, pos0)
    d64 = dqkv.astype(np.float64)
    dq = rope_backward(d64[..., : H * E].reshape(B, T, H, E), ROPE_BASE, pos0)
    dk = rope_backward(d64[..., H * E : (H + G) * E].reshape(B, T, G, E), ROPE_BASE, pos0)
    want = np.concatenate(
        [dq.reshape(B, T, H * E), dk.reshape(B, T, G * E), d64[..., (H + G) * E :]], axis=-1
    )
    assert_close("rope.dqkv", be.to_host(got), want, rtol, atol)


def check_cross_entropy_backward(be, rng, dtype, s, rtol, atol) -> None:
    """Each head's fused loss and gradient, weighted by the engine's head_scales, against
    the twin's gradient of the mean over heads with targets: a window of T tokens (head k
    has none in its last k + 1 positions), one masked position, and a head with none."""
    B, T, V, K = s.B, s.T, s.V, s.K
    window = rng.integers(0, V, (B, T))
    targets = make_targets(window, T, K).astype(np.int32)
    targets[0, 0, 1] = -1
    targets[K - 1] = -1
    logits = _randn(rng, dtype, K, B, T, V, scale=3)
    want_loss = cross_entropy_loss(logits.astype(np.float64), targets)
    want = cross_entropy_backward(logits.astype(np.float64), targets).reshape(K, B * T, V)
    scales = be.stage_scalars("head_scale", head_scales(targets))
    losses = be.to_device(np.full((K, B * T), np.nan, dtype))
    fwd_losses = be.to_device(np.full((K, B * T), np.nan, dtype))
    for k in range(K):
        rows, tk = logits[k].reshape(B * T, V), be.to_device(targets[k].reshape(-1).copy())
        be.cross_entropy_forward(fwd_losses[k], be.to_device(rows.copy()), tk)
        grad = be.to_device(rows.copy())
        be.cross_entropy_forward_backward(losses[k], grad, tk, scales, k)
        if (targets[k] >= 0).any():
            assert_close(f"cross_entropy.dlogits[{k}]", be.to_host(grad), want[k], rtol, atol)
        else:  # a head with no target: no gradient, and no loss
            assert not be.to_host(grad).any() and not be.to_host(losses[k]).any()
    got = float(be.loss_value(losses, scales))
    np.testing.assert_allclose(got, want_loss, rtol=rtol, err_msg="cross_entropy.loss")
    got = float(be.loss_value(fwd_losses, scales))
    np.testing.assert_allclose(got, want_loss, rtol=rtol, err_msg="cross_entropy_forward.loss")


def check_attention_backward(be, rng, dtype, s, rtol, atol) -> None:
    """dqkv of causal GQA attention (query head h reads kv head h // (H/G)) from the out
    and lse the engine's forward saved."""
    B, T, H, G, E = s.B, s.T, s.H, s.G, s.E
    qkv, dout = _randn(rng, dtype, B, T, (H + 2 * G) * E), _randn(rng, dtype, B, T, H * E)
    out = be.to_device(np.zeros((B, T, H * E), dtype))
    lse = be.to_device(np.zeros((B, H, T), dtype))
    d_qkv = be.to_device(qkv.copy())
    be.attention_forward(out, lse, d_qkv, H, G, E)
    dqkv = be.to_device(np.full_like(qkv, np.nan))
    be.attention_backward(dqkv, be.to_device(dout.copy()), d_qkv, out, lse, H, G, E)
    q64 = qkv.astype(np.float64)
    q = q64[..., : H * E].reshape(B, T, H, E)
    k = q64[..., H * E : (H + G) * E].reshape(B, T, G, E)
    v = q64[..., (H + G) * E :].reshape(B, T, G, E)
    assert_close("attention.out", be.to_host(out),
                 naive_attention(q, k, v).reshape(B, T, H * E), rtol, atol)  # fmt: skip
    dq, dk, dv = naive_attention_backward(q, k, v, dout.astype(np.float64).reshape(B, T, H, E))
    want = np.concatenate([x.reshape(B, T, -1) for x in (dq, dk, dv)], axis=-1)
    assert_close("attention.dqkv", be.to_host(dqkv), want, rtol, atol)


BACKWARD_CHECKS = [
    check_rmsnorm_backward,
    check_swiglu_backward,
    check_rope_backward,
    check_cross_entropy_backward,
    check_attention_backward,
]
