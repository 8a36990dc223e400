"""Checks of tests/numpy_reference.py against itself: loops, identities and invariances.

The reference is the oracle for the engine, so it must be right on its own terms. Each
test compares it with a second formulation (a per-row loop, complex rotation, a per-head
split) or with a property the math guarantees, so that a slip in the vectorised NumPy
fails here rather than being copied into the engine's expected values. The backward twins
are checked against central differences of the forward in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy_reference import (
    attention_with_grads,
    cross_entropy_backward,
    cross_entropy_loss,
    make_targets,
    naive_attention,
    naive_attention_backward,
    reference_forward,
    rmsnorm,
    rmsnorm_backward,
    rope,
    rope_backward,
    silu,
    swiglu_backward,
)

from euler.model.config import PRESETS, ModelConfig
from euler.model.params import ParamLayout, init_params

TINY = PRESETS["tiny"]
ODD = ModelConfig(vocab_size=50, d_model=36, n_head=6, n_kv_head=2, n_layer=2, context=19)


def _params(cfg: ModelConfig, seed: int = 0, dtype=np.float64) -> dict[str, np.ndarray]:
    """Named float views of a seeded flat buffer; norm weights perturbed off 1 so they matter."""
    layout = ParamLayout(cfg)
    flat = init_params(layout, seed, dtype)
    # the standard init makes every norm weight 1, which would hide a missing `* w`
    flat[layout.n_decay :] += np.random.default_rng(seed).uniform(
        -0.3, 0.3, layout.size - layout.n_decay
    )
    return layout.views(flat)


def _loop_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(B, T, H, E), (B, T, G, E) x2 -> (B, T, H, E): one query row at a time, in Python."""
    B, T, H, E = q.shape
    G = k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = h * G // H
            for t in range(T):
                s = np.array([q[b, t, h] @ k[b, j, g] for j in range(t + 1)]) / np.sqrt(E)
                w = np.exp(s - s.max())
                w /= w.sum()
                out[b, t, h] = sum(w[j] * v[b, j, g] for j in range(t + 1))
    return out


@pytest.mark.parametrize("H,G", [(4, 4), (4, 2), (6, 2), (3, 1)])
def test_naive_attention_matches_row_loop(H: int, G: int) -> None:
    rng = np.random.default_rng(1)
    B, T, E = 2, 7, 6
    q = rng.standard_normal((B, T, H, E))
    k = rng.standard_normal((B, T, G, E))
    v = rng.standard_normal((B, T, G, E))
    np.testing.assert_allclose(naive_attention(q, k, v), _loop_attention(q, k, v), atol=1e-13)


def test_gqa_is_mha_per_head_group() -> None:
    """GQA equals standard MHA run with each query head's own kv head (G = H)."""
    rng = np.random.default_rng(2)
    B, T, H, G, E = 2, 5, 6, 3, 4
    q = rng.standard_normal((B, T, H, E))
    k = rng.standard_normal((B, T, G, E))
    v = rng.standard_normal((B, T, G, E))
    kv_of_head = [h // (H // G) for h in range(H)]  # [0, 0, 1, 1, 2, 2]
    mha = naive_attention(q, k[:, :, kv_of_head], v[:, :, kv_of_head])
    np.testing.assert_allclose(naive_attention(q, k, v), mha, atol=1e-14)
    # and a single head on its own gives the same row as inside the full call
    one = naive_attention(q[:, :, 3:4], k[:, :, 1:2], v[:, :, 1:2])
    np.testing.assert_allclose(one[:, :, 0], mha[:, :, 3], atol=1e-14)


def test_attention_first_row_is_first_value() -> None:
    """Position 0 sees only itself, so its output is v[0] exactly: the mask is causal."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 4, 2, 4)) for _ in range(3))
    np.testing.assert_allclose(naive_attention(q, k, v)[:, 0], v[:, 0], atol=1e-15)


def test_rope_matches_complex_rotation() -> None:
    """Pair (i, i + E/2) as a complex number x_i + j x_{i+E/2}, multiplied by e^{j t theta_i}."""
    rng = np.random.default_rng(4)
    B, T, N, E, base = 2, 9, 3, 8, 10000.0
    x = rng.standard_normal((B, T, N, E))
    z = x[..., : E // 2] + 1j * x[..., E // 2 :]
    theta = base ** (-np.arange(0, E, 2) / E)
    z = z * np.exp(1j * np.arange(T)[None, :, None, None] * theta)
    expected = np.concatenate([z.real, z.imag], axis=-1)
    np.testing.assert_allclose(rope(x, base), expected, atol=1e-13)


def test_rope_dot_product_depends_only_on_offset() -> None:
    """Rotating q and k by the same extra offset leaves every q . k unchanged, but not q alone."""
    rng = np.random.default_rng(5)
    T, E = 11, 16
    q = rng.standard_normal((1, T, 1, E))
    k = rng.standard_normal((1, T, 1, E))
    dots = np.einsum("te,se->ts", rope(q, 500.0)[0, :, 0], rope(k, 500.0)[0, :, 0])
    shifted = np.einsum("te,se->ts", rope(q, 500.0, 7)[0, :, 0], rope(k, 500.0, 7)[0, :, 0])
    np.testing.assert_allclose(shifted, dots, atol=1e-12)
    mixed = np.einsum("te,se->ts", rope(q, 500.0, 7)[0, :, 0], rope(k, 500.0)[0, :, 0])
    assert np.abs(mixed - dots).max() > 1e-3
    # a rotation: position 0 is the identity and norms are kept
    np.testing.assert_array_equal(rope(q, 500.0)[:, 0], q[:, 0])
    np.testing.assert_allclose(
        np.linalg.norm(rope(q, 500.0), axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-14
    )


def test_rmsnorm_unit_rms_times_weight() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 5, 10)) * 4.0
    w = rng.standard_normal(10)
    y = rmsnorm(x, w, 0.0)
    np.testing.assert_allclose(np.sqrt(np.mean((y / w) ** 2, axis=-1)), 1.0, rtol=1e-14)
    # eps is added to the mean square, not to the root
    y = rmsnorm(np.full((1, 4), 0.5), np.ones(4), 0.75)
    np.testing.assert_allclose(y, 0.5, rtol=1e-15)


def test_make_targets_full_window() -> None:
    B, T, K = 2, 5, 3
    window = np.arange(B * (T + K)).reshape(B, T + K)
    targets = make_targets(window, T, K)
    assert targets.shape == (K, B, T)
    for k in range(K):
        np.testing.assert_array_equal(targets[k], window[:, 1 + k : 1 + k + T])


def test_make_targets_short_window_marks_missing() -> None:
    B, T, K = 2, 5, 4
    window = np.arange(100, 100 + B * T).reshape(B, T)
    targets = make_targets(window, T, K)
    assert targets.shape == (K, B, T)
    for k in range(K):
        n = T - 1 - k  # head k has a target for t + 1 + k < T
        np.testing.assert_array_equal(targets[k, :, :n], window[:, 1 + k :])
        assert (targets[k, :, n:] == -1).all()
    # with T = 2, heads 1.. have no target anywhere
    assert (make_targets(window[:, :2], 2, K)[1:] == -1).all()


def test_cross_entropy_uniform_logits_is_log_v() -> None:
    K, B, T, V = 3, 2, 4, 37
    targets = np.random.default_rng(7).integers(0, V, (K, B, T))
    assert cross_entropy_loss(np.zeros((K, B, T, V)), targets) == pytest.approx(np.log(V), 1e-15)


def test_cross_entropy_means_each_head_then_heads_with_targets() -> None:
    """A head with more targets does not weigh more; a head with none is left out."""
    rng = np.random.default_rng(8)
    K, B, T, V = 3, 1, 4, 5
    logits = rng.standard_normal((K, B, T, V))
    targets = rng.integers(0, V, (K, B, T))
    targets[1, 0, 1:] = -1  # head 1: one target
    targets[2] = -1  # head 2: none

    def ce(k: int, t: int) -> float:
        row = logits[k, 0, t]
        return float(np.log(np.exp(row).sum()) - row[targets[k, 0, t]])

    head0 = np.mean([ce(0, t) for t in range(T)])
    expected = (head0 + ce(1, 0)) / 2
    assert cross_entropy_loss(logits, targets) == pytest.approx(expected, rel=1e-13)
    assert cross_entropy_loss(logits, np.full_like(targets, -1)) is None


def test_forward_zero_heads_gives_log_v() -> None:
    params = _params(TINY)
    params["mtp_heads"] = np.zeros_like(params["mtp_heads"])
    window = np.random.default_rng(9).integers(0, TINY.vocab_size, (2, TINY.context))
    T = TINY.context
    loss, logits = reference_forward(TINY, params, window, make_targets(window, T, TINY.n_mtp))
    assert logits.shape == (TINY.n_mtp, 2, T, TINY.vocab_size)
    assert loss == pytest.approx(np.log(TINY.vocab_size), rel=1e-14)


@pytest.mark.parametrize("cfg", [TINY, ODD], ids=["tiny", "odd"])
def test_forward_is_causal_and_batch_independent(cfg: ModelConfig) -> None:
    """Logits at t ignore tokens after t; each sequence ignores the others in the batch."""
    rng = np.random.default_rng(10)
    params = _params(cfg)
    T = cfg.context
    tokens = rng.integers(0, cfg.vocab_size, (3, T))
    _, logits = reference_forward(cfg, params, tokens, None)
    assert np.isfinite(logits).all()

    cut = T // 2
    changed = tokens.copy()
    changed[:, cut:] = rng.integers(0, cfg.vocab_size, (3, T - cut))
    changed[:, cut] = (tokens[:, cut] + 1) % cfg.vocab_size  # surely different at `cut`
    _, logits2 = reference_forward(cfg, params, changed, None)
    np.testing.assert_allclose(logits2[:, :, :cut], logits[:, :, :cut], atol=1e-13)
    assert np.abs(logits2[:, :, cut] - logits[:, :, cut]).max() > 1e-6

    _, alone = reference_forward(cfg, params, tokens[1:2], None)
    np.testing.assert_allclose(alone[:, 0], logits[:, 1], atol=1e-13)


def test_forward_float32_tracks_float64() -> None:
    rng = np.random.default_rng(11)
    window = rng.integers(0, TINY.vocab_size, (2, TINY.context + TINY.n_mtp))
    tokens, targets = window[:, : TINY.context], make_targets(window, TINY.context, TINY.n_mtp)
    loss64, logits64 = reference_forward(TINY, _params(TINY), tokens, targets)
    loss32, logits32 = reference_forward(TINY, _params(TINY, dtype=np.float32), tokens, targets)
    assert logits32.dtype == np.float32
    np.testing.assert_allclose(logits32, logits64, atol=1e-5)
    assert loss32 == pytest.approx(loss64, rel=1e-5)


# ---------------------------------------------------------------- backward twins

FD_STEP = 1e-6  # central differences: truncation ~1e-12, rounding ~1e-10 at O(1) values
FD_RTOL, FD_ATOL = 1e-6, 1e-8


def _numeric_grad(loss, x: np.ndarray) -> np.ndarray:
    """d loss() / dx by central differences, one element of x (float64, in place) at a time."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + FD_STEP
        up = loss()
        x[i] = old - FD_STEP
        down = loss()
        x[i] = old
        grad[i] = (up - down) / (2 * FD_STEP)
    return grad


def _check_grad(name: str, analytic: np.ndarray, loss, x: np.ndarray) -> None:
    numeric = _numeric_grad(loss, x)
    assert np.abs(numeric).max() > 1e-3, f"{name}: the loss does not depend on it"
    np.testing.assert_allclose(analytic, numeric, rtol=FD_RTOL, atol=FD_ATOL, err_msg=name)


def test_rmsnorm_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(20)
    x, dy = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 3, 7))
    w = rng.standard_normal(7)
    eps = 0.3  # large, so that an eps in the wrong place shows

    def loss() -> float:
        return float((rmsnorm(x, w, eps) * dy).sum())

    dx, dw = rmsnorm_backward(x, w, eps, dy)
    _check_grad("dx", dx, loss, x)
    _check_grad("dw", dw, loss, w)


def test_swiglu_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(21)
    gate, up, dh = (rng.standard_normal((3, 5)) * 2 for _ in range(3))

    def loss() -> float:
        return float((silu(gate) * up * dh).sum())

    dgate, dup = swiglu_backward(gate, up, dh)
    _check_grad("dgate", dgate, loss, gate)
    _check_grad("dup", dup, loss, up)


def test_rope_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(22)
    x, dy = rng.standard_normal((2, 5, 2, 6)), rng.standard_normal((2, 5, 2, 6))

    def loss() -> float:
        return float((rope(x, 100.0, 3) * dy).sum())

    _check_grad("dx", rope_backward(dy, 100.0, 3), loss, x)
    # the inverse rotation: backward undoes forward (the same angles, start included)
    np.testing.assert_allclose(rope_backward(rope(x, 100.0, 3), 100.0, 3), x, atol=1e-14)


def test_cross_entropy_backward_matches_finite_differences() -> None:
    """Heads with different target counts, missing targets (-1) and a head with none: the
    weights of the engine's masking, 1 / (count_k * heads with a target)."""
    rng = np.random.default_rng(23)
    K, B, T, V = 3, 2, 4, 5
    logits = rng.standard_normal((K, B, T, V)) * 2
    window = rng.integers(0, V, (B, T))
    targets = make_targets(window, T, K)  # head k has no target in its last k + 1 positions
    targets[0, 1, 0] = -1  # a masked position inside the window
    targets[2] = -1  # and a head with none at all

    def loss() -> float:
        return float(cross_entropy_loss(logits, targets))

    dlogits = cross_entropy_backward(logits, targets)
    _check_grad("dlogits", dlogits, loss, logits)
    assert not dlogits[targets < 0].any()
    assert np.abs(dlogits[0][targets[0] >= 0]).max() > 1e-3


@pytest.mark.parametrize("H,G", [(4, 2), (3, 3), (4, 1)])
def test_attention_backward_matches_finite_differences(H: int, G: int) -> None:
    rng = np.random.default_rng(24)
    B, T, E = 2, 4, 3
    q = rng.standard_normal((B, T, H, E))
    k, v = rng.standard_normal((B, T, G, E)), rng.standard_normal((B, T, G, E))
    dout = rng.standard_normal((B, T, H, E))

    def loss() -> float:
        return float((naive_attention(q, k, v) * dout).sum())

    dq, dk, dv = naive_attention_backward(q, k, v, dout)
    _check_grad("dq", dq, loss, q)
    _check_grad("dk", dk, loss, k)
    _check_grad("dv", dv, loss, v)
    # causal: the first query sees only the first key, so its query has no gradient
    assert not dq[:, 0].any()


def test_fused_attention_oracle_matches_backward_twin() -> None:
    """attention_with_grads (the GPU kernels' oracle, on fused qkv) and the twin agree."""
    rng = np.random.default_rng(25)
    B, T, H, G, E = 2, 5, 4, 2, 3
    qkv, dout = rng.standard_normal((B, T, (H + 2 * G) * E)), rng.standard_normal((B, T, H * E))
    out, _, dqkv = attention_with_grads(qkv, dout, H, G, E)
    q = qkv[..., : H * E].reshape(B, T, H, E)
    k = qkv[..., H * E : (H + G) * E].reshape(B, T, G, E)
    v = qkv[..., (H + G) * E :].reshape(B, T, G, E)
    np.testing.assert_allclose(out, naive_attention(q, k, v).reshape(B, T, H * E), atol=1e-13)
    grads = naive_attention_backward(q, k, v, dout.reshape(B, T, H, E))
    want = np.concatenate([x.reshape(B, T, -1) for x in grads], axis=-1)
    np.testing.assert_allclose(dqkv, want, atol=1e-12)
