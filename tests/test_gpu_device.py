"""The GPU engine against the CPU engine on a real GPU (marked `gpu`, skipped without one).

Every layer's forward and backward, the matrix products and the optimizer run on both
backends from the same float32 inputs; outputs must agree to `atol + rtol |cpu|` (exact
fp32 on the GPU: TF32 off). A whole training step of a model (forward, backward, AdamW)
must agree too. The layer checks (`LAYER_CHECKS`) are shared with test_gpu_sim.py, which
runs them in the CUDA simulator on smaller shapes.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from euler.cpu.backend import CpuBackend
from euler.model.config import PRESETS
from euler.model.transformer import Model, make_targets
from euler.precision import as_float32, is_bf16

pytestmark = pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning")

# float32 on both sides, different summation orders: a few ulps after long reductions
RTOL, ATOL = 2e-5, 2e-6


def report(name: str, got: np.ndarray, want: np.ndarray, rtol=RTOL, atol=ATOL) -> None:
    """Fail naming the tensor and its worst element if any |got - want| > atol + rtol |want|
    (bf16 bits compare as their values)."""
    got = as_float32(got).astype(np.float64) if is_bf16(got) else np.asarray(got, np.float64)
    want = as_float32(want).astype(np.float64) if is_bf16(want) else np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    if not np.all(np.isfinite(got)) or excess.max(initial=-1.0) > 0:
        i = np.unravel_index(np.nanargmax(np.where(np.isfinite(got), excess, np.inf)), got.shape)
        tol = np.broadcast_to(atol, got.shape)[i] + rtol * abs(want[i])
        raise AssertionError(
            f"{name}: worst element {i}: gpu {got[i]!r} vs cpu {want[i]!r} "
            f"(|diff| {abs(got[i] - want[i]):.3g}, allowed {tol:.3g})"
        )


def run_both(cpu, gpu, method: str, args: list, outputs: dict[str, int], **tol) -> None:
    """Call `method` on both backends with the same arguments and compare the named outputs.

    args holds host arrays and scalars; the same host array twice (an alias such as dx and
    dres) stays one buffer on each side. outputs maps a tensor name to its argument index.
    """
    c_args, g_args, seen = [], [], {}
    for a in args:
        if isinstance(a, np.ndarray):
            if id(a) not in seen:
                seen[id(a)] = (a.copy(), gpu.to_device(a))
            c, g = seen[id(a)]
            c_args.append(c)
            g_args.append(g)
        else:
            c_args.append(a)
            g_args.append(a)
    getattr(cpu, method)(*c_args)
    getattr(gpu, method)(*g_args)
    for name, i in outputs.items():
        report(f"{method}.{name}", gpu.to_host(g_args[i]), c_args[i], **tol)


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check_embedding(cpu, gpu, rng, s) -> None:
    V, D, N = s.V, s.D, s.B * s.T
    tokens = rng.integers(0, V, N).astype(np.int32)
    tokens[:3] = tokens[0]  # a repeated id: the backward must add, not overwrite
    x, wte = _f32(rng, N, D), _f32(rng, V, D)
    run_both(cpu, gpu, "embedding_forward", [x, tokens, wte], {"x": 0})
    for acc in (False, True):
        run_both(cpu, gpu, "embedding_backward", [wte, x, tokens, acc], {"dwte": 0})


def check_rmsnorm(cpu, gpu, rng, s) -> None:
    N, D = s.B * s.T, s.D
    x, w = _f32(rng, N, D), _f32(rng, D, scale=0.5) + 1
    y, rstd = np.zeros((N, D), np.float32), np.zeros(N, np.float32)
    run_both(cpu, gpu, "rmsnorm_forward", [y, rstd, x, w, 1e-5], {"y": 0, "rstd": 1})
    r = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5)
    for acc in (False, True):
        dx, dy, dw = _f32(rng, N, D), _f32(rng, N, D), _f32(rng, D)
        args = [dx, dw, dy, dx, x, w, r.astype(np.float32), acc]  # dx aliases dres
        run_both(cpu, gpu, "rmsnorm_backward", args, {"dx": 0})
        # dw sums N O(1) terms in float32 in an order of its own (rows by block, then the
        # blocks' partials): orders differ by up to N eps (2.4e-5 at N = 400); 1e-5 allowed
        run_both(cpu, gpu, "rmsnorm_backward", args, {"dw": 1}, atol=1e-5)


def check_rope(cpu, gpu, rng, s) -> None:
    H, G, E = s.H, s.G, s.E
    qkv = _f32(rng, s.B, s.T, (H + 2 * G) * E)
    ang = np.arange(s.T + 3)[:, None] * 10000.0 ** (-np.arange(0, E, 2) / E)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    for method in ("rope_forward", "rope_backward"):
        run_both(cpu, gpu, method, [qkv, cos, sin, H, G, E, 2], {"qkv": 0})


def check_attention(cpu, gpu, rng, s) -> None:
    B, T, H, G, E = s.B, s.T, s.H, s.G, s.E
    qkv = _f32(rng, B, T, (H + 2 * G) * E)
    out, lse = np.zeros((B, T, H * E), np.float32), np.zeros((B, H, T), np.float32)
    run_both(cpu, gpu, "attention_forward", [out, lse, qkv, H, G, E], {"out": 0, "lse": 1})
    cpu.attention_forward(out, lse, qkv, H, G, E)
    dqkv, dout = np.full_like(qkv, np.nan), _f32(rng, B, T, H * E)
    args = [dqkv, dout, qkv, out, lse, H, G, E]
    run_both(cpu, gpu, "attention_backward", args, {"dqkv": 0}, rtol=1e-4, atol=1e-5)


def check_swiglu_residual(cpu, gpu, rng, s) -> None:
    N, F = s.B * s.T, s.F
    gu, h, dh = _f32(rng, N, 2 * F, scale=3), _f32(rng, N, F), _f32(rng, N, F)
    run_both(cpu, gpu, "swiglu_forward", [h, gu], {"h": 0})
    run_both(cpu, gpu, "swiglu_backward", [np.zeros_like(gu), dh, gu], {"dgu": 0})
    a, b = _f32(rng, N, s.D), _f32(rng, N, s.D)
    run_both(cpu, gpu, "residual_forward", [a, a, b], {"out": 0})  # out aliases a


def check_cross_entropy(cpu, gpu, rng, s) -> None:
    N, V = s.B * s.T, s.V
    logits = _f32(rng, N, V, scale=4)
    targets = rng.integers(0, V, N).astype(np.int32)
    targets[1::5] = -1
    losses = np.zeros(N, np.float32)
    run_both(cpu, gpu, "cross_entropy_forward", [losses, logits, targets], {"losses": 0})
    args = [losses, logits, targets, np.array([0.1, 0.37]), 1]
    run_both(cpu, gpu, "cross_entropy_forward_backward", args, {"losses": 0, "dlogits": 1})
    all_losses, scales = _f32(rng, 3, N), np.array([0.5, 0.0, 0.25])
    want = cpu.loss_value(all_losses, scales)
    got = float(gpu.loss_value(gpu.to_device(all_losses), gpu.to_device(scales)))
    report("loss_value", np.array(got), np.array(want), rtol=1e-12, atol=1e-12)


def check_matmul(cpu, gpu, rng, s) -> None:
    """Both backends against float64, within fp32's rounding of a K-term dot product:
    about sqrt(K) u sum_k |a_ik b_kj| (u = 2^-24; summation orders differ, split-K
    included, so a fixed tolerance between the two would be luck). TF32 would be 2^13 u."""
    M, K, N = s.B * s.T, s.D, s.F
    for ta in (False, True):
        for tb in (False, True):
            a = _f32(rng, *((K, M) if ta else (M, K)))
            b = _f32(rng, *((N, K) if tb else (K, N)))
            a64, b64 = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
            for acc in (False, True):
                out = _f32(rng, M, N)
                want = a64 @ b64 + (out if acc else 0.0)
                atol = 4 * np.sqrt(K) * 2.0**-24 * (np.abs(a64) @ np.abs(b64) + np.abs(want))
                for name, be in (("cpu", cpu), ("gpu", gpu)):
                    dev = be.to_device(out.copy())  # the CPU "device" is the array itself
                    be.matmul(dev, be.to_device(a), be.to_device(b), ta, tb, acc)
                    report(f"matmul.{name}(ta={ta}, tb={tb}, acc={acc})", be.to_host(dev), want,
                           rtol=0.0, atol=atol)  # fmt: skip


def check_adamw(cpu, gpu, rng, s) -> None:
    P = 8 * s.F + s.D
    for clip in (0.0, 1.0, 1e3):
        hp = SimpleNamespace(grad_clip=clip, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
        params, grads = _f32(rng, P), _f32(rng, P, scale=0.1)
        m, v = _f32(rng, P, scale=0.01), np.abs(_f32(rng, P, scale=1e-4))
        dev = [gpu.to_device(a) for a in (params, grads, m, v)]
        hyper = np.array([3e-4, 1 - 0.9**7, 1 - 0.95**7])  # lr, bias corrections at step 7
        want = cpu.adamw_step(params, grads, m, v, hp, hyper, P // 2)
        got = float(gpu.adamw_step(*dev, hp, gpu.to_device(hyper), P // 2))
        report(f"adamw.norm(clip={clip})", np.array(got), np.array(want), rtol=1e-9)
        for name, c, g in zip(
            ("params", "m", "v"), (params, m, v), (dev[0], dev[2], dev[3]), strict=True
        ):
            report(f"adamw.{name}(clip={clip})", gpu.to_host(g), c)


LAYER_CHECKS = [
    check_embedding,
    check_rmsnorm,
    check_rope,
    check_attention,
    check_swiglu_residual,
    check_cross_entropy,
    check_matmul,
    check_adamw,
]

# GPU shapes: head size 64 as in the `gpu` preset, T not a multiple of the attention tile
GPU_SIZES = SimpleNamespace(B=2, T=200, D=96, F=256, V=1000, H=6, G=2, E=64)


def _gpu_backend(**options):
    """An exact-fp32 GpuBackend with GpuOptions(**options); a skip without a CUDA GPU."""
    pytest.importorskip("numba.cuda")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no CUDA GPU")
    from euler.gpu.backend import GpuBackend
    from euler.gpu.options import GpuOptions

    return GpuBackend(tf32=False, options=GpuOptions(**options))


@pytest.mark.gpu
@pytest.mark.parametrize("check", LAYER_CHECKS, ids=lambda f: f.__name__[6:])
def test_layer(check) -> None:
    check(CpuBackend(), _gpu_backend(), np.random.default_rng(0), GPU_SIZES)


@pytest.mark.gpu
@pytest.mark.parametrize("E", [32, 40, 64, 128])
def test_attention_head_sizes(E) -> None:
    """The readable exact kernels (attention.py) against the CPU kernel on the GPU, grouped
    heads, several row blocks, at head sizes of the presets, one that is not a multiple of 8
    and one (128) that runs on smaller tiles."""
    sizes = SimpleNamespace(B=2, T=130, H=4, G=2, E=E)
    check_attention(CpuBackend(), _gpu_backend(), np.random.default_rng(E), sizes)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,T", [(2, 200), (8, 512), (2, 192)], ids=["prep-kernel-tail", "default", "default-192"]
)
def test_tensor_core_attention_matches_float64(B, T) -> None:
    """The TF32 tensor-core kernels (GpuBackend(tf32=True)) against a float64 reference at
    the `gpu` preset's heads, the backward twice into the same dqkv (its dQ atomics must
    start from the prep's zeros each time): TF32's 2e-3 of each output's scale
    (test_gpu_tc.py's TOL). (8, 512): many dkv blocks add into one dQ tile at once. T a
    multiple of 64: the dkv grid's first row prepares, behind flags zeroed each call (T =
    192: the heaviest blocks' first tiles wait on those of a short sequence); the blocks
    that start after their pair's prep take a loop without flags. T = 200: the prep kernel
    before dkv."""
    from euler.gpu.backend import GpuBackend
    from tests.numpy_reference import attention_with_grads

    _gpu_backend()  # skips without a GPU
    gpu = GpuBackend(tf32=True)
    H, G, E = 12, 4, 64
    rng = np.random.default_rng(T)
    qkv, dout = _f32(rng, B, T, (H + 2 * G) * E), _f32(rng, B, T, H * E)
    ref = attention_with_grads(qkv, dout, H, G, E)
    d_qkv, d_dout = gpu.to_device(qkv), gpu.to_device(dout)
    assert gpu._tensor_cores(d_qkv, E)
    out, lse = gpu.zeros((B, T, H * E), np.float32), gpu.zeros((B, H, T), np.float32)
    dqkv = gpu.zeros(qkv.shape, np.float32)
    gpu.attention_forward(out, lse, d_qkv, H, G, E)
    for call in range(2):
        gpu.attention_backward(dqkv, d_dout, d_qkv, out, lse, H, G, E)
        got = [gpu.to_host(x) for x in (out, lse, dqkv)]
        for name, g, w in zip(("out", "lse", "dqkv"), got, ref, strict=True):
            err, tol = np.abs(g - w).max(), 2e-3 * np.abs(w).max()
            assert err <= tol, f"call {call}, {name}: max error {err:.2e} > {tol:.2e}"


@pytest.mark.gpu
def test_prep_blocks_backward_replays_in_a_cuda_graph() -> None:
    """The tensor-core backward with its prep blocks captured (the flags' memset a node of
    the graph) and replayed twice gives the eager call's dqkv to TF32's rounding (dQ's
    atomic sums differ in order from call to call)."""
    gpu, rng = _gpu_backend(), np.random.default_rng(7)
    B, T, H, G, E = 4, 256, 12, 4, 64
    qkv, dout = (
        gpu.to_device(_f32(rng, B, T, (H + 2 * G) * E)),
        gpu.to_device(_f32(rng, B, T, H * E)),
    )
    out, lse = gpu.zeros((B, T, H * E), np.float32), gpu.zeros((B, H, T), np.float32)
    dqkv = gpu.zeros(qkv.shape, np.float32)
    gpu.attention_forward(out, lse, qkv, H, G, E)
    gpu.attention_backward(dqkv, dout, qkv, out, lse, H, G, E)  # eager first: the flags
    want = gpu.to_host(dqkv)
    graph, _ = gpu.capture(lambda: gpu.attention_backward(dqkv, dout, qkv, out, lse, H, G, E))
    for replay in range(2):
        gpu.copy_(dqkv, np.full(want.shape, np.nan, np.float32))
        graph.replay()
        report(f"replay {replay}", gpu.to_host(dqkv), want, atol=1e-4 * np.abs(want).max())
    graph.close()


def train_step_matches(gpu, preset, B: int, T: int, steps: int, grad_rtol: float) -> None:
    """`steps` training steps of `preset` (a name or a ModelConfig) on both backends: equal
    losses, grads and params."""
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    rng = np.random.default_rng(1)
    cpu_m, gpu_m = Model(cfg, dtype=np.float32), Model(cfg, backend=gpu, dtype=np.float32)
    hp = SimpleNamespace(grad_clip=1.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    lr, state = 1e-3, {}
    for name, m in (("cpu", cpu_m), ("gpu", gpu_m)):
        state[name] = [m.be.zeros((m.layout.size,), np.float32) for _ in range(2)]
    for step in range(1, steps + 1):
        window = rng.integers(0, cfg.vocab_size, (B, T + cfg.n_mtp))
        tokens, targets = window[:, :T], make_targets(window, T, cfg.n_mtp)
        lc = cpu_m.forward(tokens, targets, need_grad=True)
        lg = float(gpu_m.forward(tokens, targets, need_grad=True))
        report(f"step {step} loss", np.array(lg), np.array(lc), rtol=1e-5)
        cpu_m.backward()
        gpu_m.backward()
        g_host = gpu.to_host(gpu_m.grads)
        scale = np.abs(cpu_m.grads).max()
        # after the first AdamW step the parameters differ by a fraction of a step (below),
        # and so do later gradients: those steps are checked through their losses
        for name, (off, shape) in cpu_m.layout.offsets.items() if step == 1 else ():
            n = int(np.prod(shape))
            report(
                f"step {step} grad {name}", g_host[off : off + n], cpu_m.grads[off : off + n],
                rtol=grad_rtol, atol=grad_rtol * scale,
            )  # fmt: skip
        for name, m in (("cpu", cpu_m), ("gpu", gpu_m)):
            hyper = m.be.stage_scalars("adamw", [lr, 1 - 0.9**step, 1 - 0.95**step])
            m.be.adamw_step(m.params, m.grads, *state[name], hp, hyper, m.layout.n_decay)
        # Adam divides by sqrt(v) + eps, so for |g| near eps (1e-8) an absolute rounding
        # error e in g moves the step by about lr e / eps: parameters agree to a fraction of
        # one step, not to rounding (the AdamW check with identical inputs is the strict one;
        # the next step's loss checks the trajectory).
        got = gpu.to_host(gpu_m.params)
        report(f"step {step} params", got, cpu_m.params, rtol=1e-4, atol=0.5 * lr)


@pytest.mark.gpu
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_training_steps_match_cpu(tied: bool) -> None:
    cfg = dataclasses.replace(PRESETS["small"], tie_embeddings=tied)
    train_step_matches(_gpu_backend(), cfg, B=4, T=128, steps=3, grad_rtol=1e-5)


def markov_batches(V: int, B: int, T: int, K: int, steps: int, seed: int = 0):
    """(tokens, targets) per step from a fixed sparse Markov chain: a loss that can fall."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, V, (V, 4))  # each token has 4 likely successors
    for _ in range(steps):
        w = np.empty((B, T + K), np.int64)
        w[:, 0] = rng.integers(0, V, B)
        for t in range(1, T + K):
            w[:, t] = nxt[w[:, t - 1], rng.integers(0, 4, B)]
        yield w[:, :T], make_targets(w, T, K)


def train_losses(backend, preset: str, B: int, T: int, steps: int, lr: float) -> np.ndarray:
    """Losses of `steps` AdamW steps of `preset` on the Markov stream, float32."""
    from euler.training.optim import AdamW

    cfg = PRESETS[preset]
    model = Model(cfg, backend=backend, dtype=np.float32)
    opt = AdamW(model)
    out = []
    for tokens, targets in markov_batches(cfg.vocab_size, B, T, cfg.n_mtp, steps):
        out.append(float(model.forward(tokens, targets, need_grad=True)))
        model.backward()
        opt.step(lr)
    return np.array(out)


@pytest.mark.gpu
@pytest.mark.slow
def test_small_preset_200_steps_match_cpu() -> None:
    """200 steps of the `small` preset: the GPU's loss curve lies on the CPU's.

    fp32 on both, TF32 off; rounding differences grow slowly through AdamW, so the curves
    are compared to 1% per step, not to rounding.
    """
    args = ("small", 8, 128, 200, 3e-3)
    gpu_backend = _gpu_backend()  # skips at once without a GPU
    cpu = train_losses(CpuBackend(), *args)
    gpu = train_losses(gpu_backend, *args)
    assert cpu[-1] < cpu[0] - 1.0, f"the CPU run did not learn: {cpu[0]:.3f} -> {cpu[-1]:.3f}"
    rel = np.abs(gpu - cpu) / cpu
    worst = int(rel.argmax())
    assert rel.max() < 1e-2, f"step {worst + 1}: gpu {gpu[worst]:.5f} vs cpu {cpu[worst]:.5f}"


@pytest.mark.gpu
def test_chat_decoder_on_gpu_gives_the_cpu_tokens() -> None:
    """`euler chat --device cuda`'s decoder: the CPU KV-cache decoder's greedy tokens."""
    import dataclasses

    from euler.inference.decode_device import RecomputeDecoder
    from euler.inference.generate import Decoder, generate, generate_speculative
    from euler.inference.sampling import SamplingConfig

    cfg = dataclasses.replace(PRESETS["small"], init_std=0.5)  # spread logits: no near ties
    params = Model(cfg, seed=3).params
    greedy, prompt = SamplingConfig(temperature=0.0), [5, 17, 2, 99]
    want = generate(Decoder(cfg, params), prompt, 40, greedy)
    got = generate(RecomputeDecoder(cfg, params, _gpu_backend()), prompt, 40, greedy)
    assert got.tokens == want.tokens and len(set(want.tokens)) > 3
    spec = generate_speculative(RecomputeDecoder(cfg, params, _gpu_backend()), prompt, 40)
    assert spec.tokens == want.tokens


@pytest.mark.gpu
def test_kv_cache_decoding_on_gpu_gives_the_cpu_tokens() -> None:
    """The GPU's KV-cache kernels (euler/gpu/decode.py) batched: each sequence's greedy
    tokens are the CPU decoder's, and the GPU's hidden rows of a sequence are bit-identical
    in a batch and alone."""
    import dataclasses

    from euler.inference.batch import BatchDecoder
    from euler.inference.engine import GenRequest, generate_batch

    cfg = dataclasses.replace(PRESETS["small"], init_std=0.5)  # spread logits: no near ties
    params = Model(cfg, seed=3).params
    requests = [GenRequest((5, 17, 2, 99), 40), GenRequest((7,), 30), GenRequest((1, 2), 50)]
    want = generate_batch(BatchDecoder(cfg, params, 3), requests)
    got = generate_batch(BatchDecoder(cfg, params, 3, backend=_gpu_backend()), requests)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert len(set(want[0].tokens)) > 3
    batch = BatchDecoder(cfg, params, 2, backend=_gpu_backend())
    together = batch.feed([(1, [5, 17, 2]), (0, [9, 8])])
    alone = BatchDecoder(cfg, params, 1, backend=_gpu_backend()).feed([(0, [5, 17, 2])])
    assert alone[0].tobytes() == together[0].tobytes()


@pytest.mark.gpu
def test_kv_cache_decoding_replayed_as_graphs_equals_launched() -> None:
    """BatchDecoder's CUDA graphs (a feed's forward and the heads' product, captured on a
    row count's second call): every step's hidden rows and logits bit-identical to the
    decoder that launches each kernel, over steps whose positions and slots change."""
    import dataclasses

    from euler.inference.batch import BatchDecoder

    cfg = dataclasses.replace(PRESETS["small"], init_std=0.5)
    params = Model(cfg, seed=3).params
    graphed, launched = (BatchDecoder(cfg, params, 2, backend=_gpu_backend(), cuda_graph=g)
                         for g in (True, False))  # fmt: skip
    feeds = [[(0, [5, 17, 2]), (1, [9])], [(0, [4]), (1, [8])], [(1, [3]), (0, [6])]]
    feeds += [[(0, [t]), (1, [t + 1])] for t in range(10, 20)]
    for feed in feeds:
        a, b = graphed.feed(feed), launched.feed(feed)
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
        rows = np.stack([r[-1] for r in a])
        assert graphed.logits(rows).tobytes() == launched.logits(rows).tobytes()
    assert graphed.graphs.nodes() > 0 and launched.graphs.nodes() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_matmul_strided_batched(trans_a, trans_b) -> None:
    gpu, rng = _gpu_backend(), np.random.default_rng(2)
    Z, M, K, N = 3, 17, 40, 23
    a = _f32(rng, Z, *((K, M) if trans_a else (M, K)))
    b = _f32(rng, Z, *((N, K) if trans_b else (K, N)))
    out = gpu.zeros((Z, M, N), np.float32)
    gpu.matmul_batched(out, gpu.to_device(a), gpu.to_device(b), trans_a, trans_b)
    want = (a.transpose(0, 2, 1) if trans_a else a) @ (b.transpose(0, 2, 1) if trans_b else b)
    report("matmul_batched", gpu.to_host(out), want)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])  # fmt: skip
def test_cublaslt_gemm_with_and_without_c(trans_a, trans_b, tf32) -> None:
    """cublaslt.CublasLt: out = op(a) op(b) (+ c, C != D, c left as it was), exact fp32
    (within fp32 rounding of a 40-term sum) or TF32 (about 1e-3 relative)."""
    from numba import cuda

    from euler.gpu.backend import CUBLAS_WORKSPACE
    from euler.gpu.cublaslt import CublasLt

    gpu, rng = _gpu_backend(), np.random.default_rng(5)
    M, K, N = 37, 40, 23
    a = _f32(rng, *((K, M) if trans_a else (M, K)))
    b = _f32(rng, *((N, K) if trans_b else (K, N)))
    c0 = _f32(rng, M, N)
    handle = gpu.stream.handle
    workspace = cuda.device_array(CUBLAS_WORKSPACE, np.uint8, stream=gpu.stream)
    lt = CublasLt(int(getattr(handle, "value", handle)), workspace, tf32=tf32)
    product = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    tol = dict(rtol=3e-3, atol=3e-3 * np.abs(product).max()) if tf32 else dict(atol=1e-5)
    A, B, C = gpu.to_device(a), gpu.to_device(b), gpu.to_device(c0)
    for c, want in ((None, product), (C, product + c0)):
        out = gpu.to_device(np.full((M, N), np.nan, np.float32))
        for _ in range(2):  # the second call reuses the plan
            lt.gemm(out, A, B, trans_a, trans_b, c=c)
        report(f"cublasLt gemm (c: {c is not None})", gpu.to_host(out), want, **tol)
    np.testing.assert_array_equal(gpu.to_host(C), c0)
    gpu.synchronize()
    lt.close()


@pytest.mark.gpu
def test_fused_residual_training_steps_match_cpu() -> None:
    """GpuOptions.fused_residual: the output projections and their residual adds as
    cuBLASLt calls, in whole training steps."""
    gpu = _gpu_backend(fused_residual=True)
    train_step_matches(gpu, "small", B=4, T=128, steps=3, grad_rtol=1e-5)
    assert gpu._lt is not None and not any(k[0] == "matmul_residual" for k in gpu._scratch)


@pytest.mark.gpu
def test_fused_residual_replays_in_a_cuda_graph() -> None:
    """A captured matmul_residual (GpuOptions.fused_residual) replays with the inputs of
    the moment."""
    gpu, rng = _gpu_backend(fused_residual=True), np.random.default_rng(6)
    N, D, F = 64, 48, 80
    res_h, a_h, w_h = _f32(rng, N, D), _f32(rng, N, F), _f32(rng, D, F)
    out, res, a, w = (gpu.to_device(x) for x in (np.zeros((N, D), np.float32), res_h, a_h, w_h))
    gpu.matmul_residual(out, res, a, w)  # eager first: the plan, as the trainer's warm-up
    graph, _ = gpu.capture(lambda: gpu.matmul_residual(out, res, a, w))
    for step in range(2):
        res_h, a_h = _f32(rng, N, D), _f32(rng, N, F)
        gpu.copy_(res, res_h)
        gpu.copy_(a, a_h)
        graph.replay()
        want = res_h + a_h.astype(np.float64) @ w_h.T
        report(f"replay {step}", gpu.to_host(out), want, atol=1e-5)
    graph.close()


def test_missing_gpu_or_cublas_is_a_one_line_error(monkeypatch) -> None:
    """Without a GPU (or cuBLAS) the backend says which is missing and how to install."""
    pytest.importorskip("numba.cuda")
    from euler.errors import EulerError
    from euler.gpu import backend, cublas

    monkeypatch.setattr(backend.cuda, "is_available", lambda: False)
    with pytest.raises(EulerError, match=r"no CUDA GPU found.*nanoeuler\[gpu\]"):
        backend.GpuBackend()
    monkeypatch.setattr(cublas, "_candidates", lambda: ["/nonexistent/libcublas.so"])
    with pytest.raises(EulerError, match=r"cuBLAS not found.*nanoeuler\[gpu\]"):
        cublas.load_library()


@pytest.mark.gpu
def test_cuda_graph_steps_train_as_launched_steps(tmp_path_factory, monkeypatch) -> None:
    """`euler train --device cuda --cuda-graph` (steps replayed as CUDA graphs) gives the
    losses and gradient norms of the same run launching every kernel itself."""
    _gpu_backend()  # skips at once without a GPU
    from euler.gpu.backend import GpuBackend
    from euler.training import loop as train_mod
    from tests.train_helpers import build_data, read_metrics, tiny_config

    data = build_data(tmp_path_factory) / "pre"
    runs, summaries = {}, {}
    for graph in (False, True):
        backend = GpuBackend(tf32=False, tile=16)  # the one-row attention kernels: quick builds
        monkeypatch.setattr(train_mod, "make_backend", lambda *a, b=backend, **k: b)
        out = tmp_path_factory.mktemp(f"graph{graph}")
        tc = tiny_config(out, data, device="cuda", cuda_graph=graph, steps=6, grad_accum=2)
        summaries[graph] = train_mod.train(tc)
        runs[graph] = [(r["loss"], r["grad_norm"]) for r in read_metrics(out) if "loss" in r]
    assert summaries[False]["graph_nodes"] == 0 and summaries[True]["graph_nodes"] > 100
    # the same kernels in the same order; only float atomics (embedding backward) may differ
    np.testing.assert_allclose(runs[True], runs[False], rtol=1e-5)
    assert summaries[True]["val_loss"] == pytest.approx(summaries[False]["val_loss"], rel=1e-5)
