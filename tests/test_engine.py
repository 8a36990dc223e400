"""The CPU engine against the independent NumPy reference, plus its contracts and errors."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from euler.cpu.backend import CpuBackend
from euler.errors import EulerError
from euler.model.config import PRESETS, ModelConfig, get_preset
from euler.model.gradcheck import ODD_CONFIG, gradcheck_rows
from euler.model.params import ParamLayout, param_table
from euler.model.transformer import Model, head_scales, make_targets
from euler.training.optim import AdamW, AdamWConfig
from tests import numpy_reference as ref

CONFIGS = {"tiny": PRESETS["tiny"], "odd": ODD_CONFIG}


def _batch(cfg: ModelConfig, B: int, T: int, extra: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    window = rng.integers(0, cfg.vocab_size, (B, T + extra))
    return window[:, :T].astype(np.int32), make_targets(window, T, cfg.n_mtp)


def test_preset_parameter_counts():
    assert get_preset("small").n_params() == 1_049_216
    assert get_preset("gpu").n_params() == 116_417_280
    cfg = get_preset("small")
    assert ParamLayout(cfg).size == cfg.n_params()


def test_info_cli_prints_counts():
    out = subprocess.run(
        [sys.executable, "-m", "euler.cli", "info", "--preset", "gpu"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "116,417,280" in out


def test_layout_decay_prefix_holds_matrices_only():
    cfg = CONFIGS["odd"]
    layout = ParamLayout(cfg)
    for name, shape, decay in param_table(cfg):
        off, _ = layout.offsets[name]
        assert (off < layout.n_decay) == decay
        assert decay == (len(shape) > 1)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("extra", [0, 2, 4])  # windows shorter than T + K leave heads short
def test_engine_equals_numpy_reference_float64(name, extra):
    cfg = CONFIGS[name]
    B, T = 2, cfg.context - 3
    tokens, targets = _batch(cfg, B, T, extra, seed=extra)
    model = Model(cfg, dtype=np.float64, seed=7)
    loss = model.forward(tokens, targets)
    params = {k: np.asarray(v) for k, v in model.p.items()}
    ref_loss, ref_logits = ref.reference_forward(cfg, params, tokens, targets)
    if extra == 0:  # a bare T window: head k has no target at its last k + 1 positions
        assert (targets[-1][:, T - cfg.n_mtp :] == -1).all()
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    for k in range(cfg.n_mtp):
        np.testing.assert_allclose(model.head_logits(k), ref_logits[k], rtol=1e-10, atol=1e-10)


def test_targets_and_head_scales():
    window = np.arange(12).reshape(2, 6)
    t = make_targets(window, 4, 3)
    assert t.shape == (3, 2, 4)
    np.testing.assert_array_equal(t[0, 0], [1, 2, 3, 4])
    np.testing.assert_array_equal(t[2, 1], [9, 10, 11, -1])
    np.testing.assert_array_equal(t, ref.make_targets(window, 4, 3))
    mask = np.ones_like(window)
    mask[:, 2] = 0
    tm = make_targets(window, 4, 3, mask)
    assert tm[0, 0, 1] == -1 and tm[1, 0, 0] == -1 and tm[0, 0, 0] == 1
    s = head_scales(np.full((2, 1, 3), -1, np.int32))
    assert (s == 0).all()
    s = head_scales(t)
    assert s[0] == pytest.approx(1 / (8 * 3)) and s[2] == pytest.approx(1 / (6 * 3))


def test_gradcheck_passes_every_row():
    rows = gradcheck_rows(seed=1, samples=4)
    assert len(rows) > 60
    bad = [(r.layer, r.tensor, r.max_rel) for r in rows if not r.ok]
    assert not bad


def test_gradcheck_catches_a_wrong_gradient(monkeypatch):
    """The check must be able to fail: break the SwiGLU backward and watch it report."""
    from euler.cpu import backend

    real = backend.swiglu.swiglu_backward

    def broken(dgu, dh, gu):
        real(dgu, dh, gu)
        dgu[:, ::2] *= 1.0001  # a 1e-4 error on half the entries

    monkeypatch.setattr(backend.swiglu, "swiglu_backward", broken)
    rows = gradcheck_rows(seed=2, samples=4)
    failed = {r.layer for r in rows if not r.ok}
    assert {"tiny: swiglu", "tiny: model", "odd: swiglu", "odd: model"} <= failed


def test_float32_layers_follow_float64():
    cfg = CONFIGS["odd"]
    tokens, targets = _batch(cfg, 2, cfg.context, cfg.n_mtp)
    m64 = Model(cfg, dtype=np.float64, seed=5)
    m32 = Model(cfg, dtype=np.float32, flat_params=m64.params.astype(np.float32))
    l64 = m64.forward(tokens, targets, need_grad=True)
    l32 = m32.forward(tokens, targets, need_grad=True)
    m64.backward()
    m32.backward()
    assert l32 == pytest.approx(l64, rel=1e-5)
    for name in m64.g:
        g64, g32 = m64.g[name], m32.g[name]
        err = np.abs(g32 - g64).max() / max(np.abs(g64).max(), 1e-12)
        assert err < 1e-3, name


def test_flash_attention_equals_naive_attention():
    from euler.cpu.backend import CpuBackend

    be = CpuBackend(attention_tile=32)
    rng = np.random.default_rng(3)
    B, T, H, G, E = 2, 70, 6, 2, 8  # T spans three key tiles, the last one partial
    qkv = rng.standard_normal((B, T, (H + 2 * G) * E))
    out, lse = np.empty((B, T, H * E)), np.empty((B, H, T))
    be.attention_forward(out, lse, qkv, H, G, E)
    q = qkv[..., : H * E].reshape(B, T, H, E)
    k = qkv[..., H * E : (H + G) * E].reshape(B, T, G, E)
    v = qkv[..., (H + G) * E :].reshape(B, T, G, E)
    np.testing.assert_allclose(out.reshape(B, T, H, E), ref.naive_attention(q, k, v), atol=1e-12)


def test_gradient_accumulation_adds_micro_batches():
    cfg = CONFIGS["tiny"]
    t1, g1 = _batch(cfg, 2, 16, 4, seed=1)
    t2, g2 = _batch(cfg, 2, 16, 4, seed=2)
    m = Model(cfg, dtype=np.float64, seed=3)
    m.forward(t1, g1, need_grad=True)
    m.backward()
    first = m.grads.copy()
    m.forward(t2, g2, need_grad=True)
    m.backward()
    second = m.grads.copy()
    m.forward(t1, g1, need_grad=True)
    m.backward()
    m.forward(t2, g2, need_grad=True, accumulate=True)
    m.backward()
    np.testing.assert_allclose(m.grads, first + second, rtol=1e-12, atol=1e-15)


class LazySideBackend(CpuBackend):
    """The CPU backend with the GPU's side stream at its laziest: a pair's second product
    (a weight gradient) runs only when a wait_deferred makes it due, so it reads its
    inputs as late as the GPU ever could."""

    def __init__(self):
        super().__init__()
        self.queue: list[tuple] = []
        self.most_queued = 0

    def matmul_pair(self, first, second) -> None:
        self.matmul(*first)
        self.queue.append(second)
        self.most_queued = max(self.most_queued, len(self.queue))

    def wait_deferred(self, keep: int = 0) -> None:
        while len(self.queue) > keep:
            self.matmul(*self.queue.pop(0))


def test_deferred_weight_gradients_wait_for_nothing_they_read():
    """Gradients with the weight products run as late as wait_deferred allows equal the
    in-line ones, micro-batches accumulated: no input is overwritten before they read it."""
    cfg = CONFIGS["tiny"]
    batches = [_batch(cfg, 2, 16, 4, seed=s) for s in (1, 2)]
    grads = []
    for be in (CpuBackend(), LazySideBackend()):
        m = Model(cfg, backend=be, dtype=np.float64, seed=3)
        for i, (tokens, targets) in enumerate(batches):
            m.forward(tokens, targets, need_grad=True, accumulate=i > 0)
            m.backward()
        grads.append(m.grads.copy())
    assert be.queue == [] and be.most_queued == 3  # the last two layers' overlap
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-15)


def test_adamw_matches_numpy_and_skips_norm_decay():
    cfg = CONFIGS["tiny"]
    m = Model(cfg, dtype=np.float64, seed=1)
    rng = np.random.default_rng(0)
    hp = AdamWConfig(weight_decay=0.1, grad_clip=0.5)
    opt = AdamW(m, hp)
    p = m.params.copy()
    mom, vel = np.zeros_like(p), np.zeros_like(p)
    decay = np.zeros_like(p)
    decay[: m.layout.n_decay] = hp.weight_decay
    for step in (1, 2):
        g = rng.standard_normal(p.size)
        m.grads[:] = g
        norm = opt.step(lr=0.01)
        assert norm == pytest.approx(np.linalg.norm(g))
        g = g * (hp.grad_clip / (norm + 1e-6))
        mom = 0.9 * mom + 0.1 * g
        vel = 0.95 * vel + 0.05 * g * g
        mhat, vhat = mom / (1 - 0.9**step), vel / (1 - 0.95**step)
        p = p - 0.01 * (mhat / (np.sqrt(vhat) + hp.eps) + decay * p)
    np.testing.assert_allclose(m.params, p, rtol=1e-12, atol=1e-14)


def test_training_steps_are_deterministic():
    cfg = CONFIGS["tiny"]

    def run():
        m = Model(cfg, dtype=np.float32, seed=11)
        opt = AdamW(m)
        losses = []
        tokens, targets = _batch(cfg, 4, cfg.context, cfg.n_mtp)
        for _ in range(4):
            losses.append(m.forward(tokens, targets, need_grad=True))
            m.backward()
            opt.step(lr=1e-2)
        return losses, m.params.copy()

    (l1, p1), (l2, p2) = run(), run()
    assert l1 == l2
    assert np.array_equal(p1, p2)
    assert l1[-1] < l1[0]


@pytest.mark.parametrize(
    "fields, culprit",
    [
        ({"d_model": 30, "n_head": 4}, "d_model"),
        ({"n_head": 4, "n_kv_head": 3}, "n_head"),
        ({"d_model": 12, "n_head": 4, "n_kv_head": 2}, "head size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"norm_eps": -1.0}, "norm_eps"),
    ],
)
def test_bad_config_names_the_field(fields, culprit):
    with pytest.raises(EulerError, match=culprit):
        ModelConfig(**fields)


def test_bad_inputs_are_refused_before_any_kernel():
    cfg = CONFIGS["tiny"]
    m = Model(cfg, dtype=np.float32)
    with pytest.raises(EulerError, match="context"):
        m.forward(np.zeros((1, cfg.context + 1), np.int32))
    with pytest.raises(EulerError, match="outside the vocabulary"):
        m.forward(np.full((1, 4), cfg.vocab_size, np.int32))
    with pytest.raises(EulerError, match="outside the vocabulary"):
        m.forward(np.full((1, 4), -1, np.int32))
    bad_targets = np.full((cfg.n_mtp, 1, 4), cfg.vocab_size, np.int32)
    with pytest.raises(EulerError, match="targets"):
        m.forward(np.zeros((1, 4), np.int32), bad_targets)
    with pytest.raises(EulerError, match="bogus: unknown field"):
        ModelConfig.from_dict({"d_model": 32, "bogus": 1})


def test_cli_reports_bad_preset_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "euler.cli", "info", "--preset", "huge"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--preset" in r.stderr


def test_gradcheck_cli_prints_table_and_exits_zero():
    r = subprocess.run(
        [sys.executable, "-m", "euler.cli", "gradcheck", "--samples", "2"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "max rel err" in r.stdout and "0 failed" in r.stdout


def test_failing_gradcheck_exits_non_zero(monkeypatch):
    from euler.cli import main as cli_main

    from euler.model.gradcheck import Row

    monkeypatch.setattr(
        "euler.model.gradcheck.gradcheck_rows",
        lambda seed, samples, threads: [Row("x", "y", 1, 1.0, 1.0)],
    )
    monkeypatch.setattr(sys, "argv", ["euler", "gradcheck"])
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main()
    assert exit_info.value.code == 1


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocked_products_equal_numpy(trans_a, trans_b, accumulate, dtype):
    import numba

    from euler.cpu.blas import ProductPlan, Products

    if numba.get_num_threads() < 2:
        pytest.skip("one thread computes a product whole")
    rng = np.random.default_rng(0)
    # M not a multiple of the row blocks; K long enough that a weight gradient's sum is cut
    M, K, N = 301, 1100, 300
    plan = ProductPlan(per_thread=16, many_threads=1 << 20)
    mb, nb, pieces = plan.cut(M, N, K, trans_a, threads=numba.get_num_threads())
    assert mb > 1 and nb > 1 and (pieces > 1) == trans_a  # this test must exercise every cut
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(dtype)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(dtype)
    out = rng.standard_normal((M, N)).astype(dtype)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b) + (out if accumulate else 0)
    Products(plan)(out, a, b, trans_a, trans_b, accumulate)
    tol = 1e-12 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())


def test_blocked_products_take_views_pairs_and_empty_shapes():
    from euler.cpu.blas import Products

    mm = Products()
    rng = np.random.default_rng(1)
    big = rng.standard_normal((40, 300))
    a, b = big[:, 10:110], big[:7, 50:150]  # rows 300 apart: BLAS reads them in place
    ab, ba = np.zeros((40, 7)), np.zeros((7, 40))
    mm.pair((ab, a, b, False, True, False), (ba, b, a, False, True, False))
    np.testing.assert_allclose(ab, a @ b.T, rtol=1e-12)
    np.testing.assert_allclose(ba, b @ a.T, rtol=1e-12)
    empty = np.zeros((0, 7))
    mm(empty, a[:0], b, trans_b=True)  # nothing to compute, nothing called
    with pytest.raises(ValueError, match="shapes"):
        mm(ab, a, b)


def test_product_plans_cut_sums_by_shape_and_blocks_by_threads():
    from euler.cpu.blas import ProductPlan

    cut = ProductPlan().cut
    # one thread: a product whole, but a weight gradient's sum still in its pieces
    assert cut(2048, 128, 128, False, threads=1) == (1, 1, 1)
    assert cut(682, 128, 2048, True, threads=1) == (1, 1, 4)
    # the small preset's products: two blocks a thread below 4 threads, one from 4 on; a
    # tall activation by rows, weight gradients with long sums by pieces and then rows or
    # columns of 64 or more
    assert cut(2048, 128, 128, False, threads=2) == (4, 1, 1)
    assert cut(2048, 128, 128, False, threads=4) == (4, 1, 1)
    assert cut(2048, 128, 128, False, threads=16) == (16, 1, 1)
    assert cut(682, 128, 2048, True, threads=16) == (4, 1, 4)
    assert cut(128, 341, 2048, True, threads=16) == (1, 4, 4)
    assert cut(128, 341, 2048, True, threads=4) == (1, 1, 4)
    # the gpu preset's: wide outputs are cut both ways, never their sums
    assert cut(2048, 1280, 768, False, threads=16) == (4, 4, 1)
    assert cut(1280, 768, 2048, True, threads=16) == (4, 4, 1)
    assert cut(2048, 1280, 768, False, threads=3) == (3, 2, 1)
    # small products stay whole; no block is narrower than 64 rows or columns
    assert cut(8, 8, 8, False, threads=16) == (1, 1, 1)
    assert cut(100, 4096, 512, False, threads=16) == (1, 16, 1)
    assert cut(100, 4096, 512, False, threads=4) == (1, 4, 1)
    assert cut(100, 4096, 512, False, threads=2) == (1, 4, 1)
    # pair_per_thread: each product of a pair cut finer than one alone, below many_threads
    paired = ProductPlan(per_thread=1, pair_per_thread=2).cut
    assert paired(2048, 128, 128, False, threads=2) == (2, 1, 1)
    assert paired(2048, 128, 128, False, threads=2, paired=True) == (4, 1, 1)
    assert paired(2048, 128, 128, False, threads=16, paired=True) == (16, 1, 1)
    # cut_as_for: the same blocks at every count, one thread included
    fixed = ProductPlan(cut_as_for=16).cut
    assert {fixed(2048, 128, 128, False, threads=t) for t in (1, 2, 16)} == {(16, 1, 1)}


def test_default_plan_follows_the_threads_only_under_tile_exact_kernels(monkeypatch):
    from euler.cpu import blas

    monkeypatch.setattr(blas, "core_name", lambda: "SkylakeX")
    assert blas.default_plan() == blas.ProductPlan()
    monkeypatch.setattr(blas, "core_name", lambda: "Haswell")
    assert blas.default_plan().cut_as_for == os.cpu_count()


# OpenBLAS's own kernel pick, and its Haswell family (every AVX2 CPU's), whose blocks differ
# from the whole product in a tile's last rows: the cut must then not follow the threads
KERNEL_FAMILIES = [None, pytest.param("HASWELL", marks=pytest.mark.skipif(
    platform.machine() != "x86_64", reason="an x86-64 kernel family"))]  # fmt: skip


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_training_bits_do_not_depend_on_the_thread_count(family):
    """Three steps at each thread count in one process (NUMBA_NUM_THREADS the largest):
    the losses and every parameter bit equal, under OpenBLAS's own kernel pick and under
    its Haswell kernels. EULER_TEST_THREADS widens it (1,2,4,8,16)."""
    counts = os.environ.get("EULER_TEST_THREADS", "1,2,3,4")
    code = f"""
import numba, numpy as np
from euler.bench.steps import synthetic_batch
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.optim import AdamW
cfg = get_preset("small")
tokens, targets = synthetic_batch(cfg, 4, 128)
ref = None
for n in ({counts},):
    numba.set_num_threads(n)
    model = Model(cfg, seed=0)
    opt = AdamW(model)
    losses = []
    for _ in range(3):
        losses.append(model.forward(tokens, targets, need_grad=True))
        model.backward()
        opt.step(1e-3)
    got = (losses, model.params.copy())
    if ref is None:
        ref = got
    assert got[0] == ref[0], (n, got[0], ref[0])
    assert np.array_equal(got[1], ref[1]), n
print("same bits at", {counts!r})
"""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(max(int(c) for c in counts.split(","))))
    if family:
        env["OPENBLAS_CORETYPE"] = family
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "same bits" in out.stdout


def test_compiled_kernels_live_in_a_folder_named_by_the_sources(tmp_path):
    """Numba checks a cached kernel against its own file only; the folder name covers the
    helpers it inlines from other files. A user's NUMBA_CACHE_DIR wins."""
    import numba

    from euler.cache import source_digest

    assert numba.config.CACHE_DIR.endswith(source_digest())
    code = "import euler, numba; print(numba.config.CACHE_DIR)"
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(tmp_path)


def test_cpu_launchers_refuse_shapes_their_kernels_would_overrun():
    """Numba kernels do not check bounds: the launcher must."""
    from euler.cpu.backend import CpuBackend

    be = CpuBackend()
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="rstd"):
        be.rmsnorm_forward(
            np.zeros_like(x), np.zeros(3, np.float32), x, np.ones(8, np.float32), 1e-5
        )
    qkv = np.zeros((1, 5, (4 + 2 * 2) * 2), np.float32)
    with pytest.raises(ValueError, match="lse"):
        be.attention_forward(np.zeros((1, 5, 8), np.float32), np.zeros((1, 4, 4)), qkv, 4, 2, 2)
    cos = np.zeros((4, 1), np.float32)
    with pytest.raises(ValueError, match="positions"):
        be.rope_forward(qkv, cos, cos, 4, 2, 2)
