"""Every GPU kernel compiles to PTX for sm_90 (Hopper), with no GPU present.

The launchers are driven with host arrays while kernel launches are intercepted, so each
kernel is compiled for exactly the argument types its launcher passes. float32 kernels
must carry no float64 arithmetic (a stray Python float literal would promote the math);
only the norm and loss reductions, which accumulate in float64 on purpose, may. The
compiles run in a subprocess started by conftest.py, beside the session.
"""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if cuda.config.ENABLE_CUDASIM:
    pytest.skip("compiles real kernels; meaningless in the simulator", allow_module_level=True)

import numba  # noqa: E402
import numba.cuda.dispatcher as dispatcher  # noqa: E402

from euler.gpu import (  # noqa: E402
    adamw,
    attention,
    cross_entropy,
    decode,
    embedding,
    memory,
    naive_attention,
    residual,
    rmsnorm,
    rope,
    swiglu,
    transpose,
)

IN_BACKGROUND = os.environ.get("EULER_TEST_BACKGROUND") == "1"
F64_ALLOWED = {
    "loss_sum_kernel", "grad_sumsq_kernel", "norm_and_scale_kernel", "adamw_kernel",
    "adamw_vec_kernel",
}  # fmt: skip
F64_OP = re.compile(r"\.f64\b")
# kernels that read a float64 scalar staged by the host (a head's loss scale) and convert
# it once; any float64 arithmetic in them still fails
F64_SCALAR_READS = {"cross_entropy_forward_backward_kernel"}
F64_READ = re.compile(r"^(\.reg \.f64|ld\.global\.f64|cvt\.rn\.f32\.f64)\b")
# bf16 RoPE, cross-entropy and AdamW: the vector accesses each makes (vector.py: 8 bf16 as 4
# uint32 words, float32 4 at a time; AdamW's bf16 copies 4 an 8-byte store, measured faster).
# AdamW's kernels read its float64 staged scalars only.
BF16_ACCESSES = {
    "rope_rows_bf16_kernel": ("ld.global.v4.f32", "st.global.v4.u32"),  # cos, sin; bf16 out
    "cross_entropy_forward_bf16_kernel": ("ld.global.v4.u32",),
    "cross_entropy_forward_backward_bf16_kernel": ("ld.global.v4.u32", "st.global.v4.u32"),
    "adamw_lowp_vec_kernel": ("ld.global.v4.f32", "st.global.v4.f32", "st.global.v2.u32"),
}
F64_SCALAR_READS |= {
    "cross_entropy_forward_backward_bf16_kernel", "adamw_lowp_kernel", "adamw_lowp_vec_kernel",
}  # fmt: skip


def _record_launches(monkeypatch) -> list[tuple[object, tuple]]:
    """The list that every kernel launch from now on appends (kernel, args) to, instead of
    launching."""
    calls: list[tuple[object, tuple]] = []
    monkeypatch.setattr(
        dispatcher.CUDADispatcher,
        "__getitem__",
        lambda self, cfg: lambda *args: calls.append((self, args)),
    )
    # raising a kernel's shared-memory limit needs a loaded module, so a GPU: skip it here
    monkeypatch.setattr(attention, "_raise_shared_limit", lambda *a: None)
    return calls


def _launches(monkeypatch) -> list[tuple[object, tuple]]:
    """(kernel, args) of every launch made by each launcher on small host arrays."""
    calls = _record_launches(monkeypatch)
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    N, D, F, V, K, B, T = 6, 8, 12, 10, 4, 2, 3
    tokens = np.zeros(N, np.int32)
    memory.fill(f32(N), 0)
    embedding.embedding_forward(f32(N, D), tokens, f32(V, D))
    embedding.embedding_backward(f32(V, D), f32(N, D), tokens, True)
    for d, f in ((D, F), (D - 1, F - 1)):  # rows of 16-byte pieces (vector.py), and not
        residual.residual_forward(f32(N, d), f32(N, d), f32(N, d))
        swiglu.swiglu_forward(f32(N, f), f32(N, 2 * f))
        swiglu.swiglu_backward(f32(N, 2 * f), f32(N, f), f32(N, 2 * f))
        rmsnorm.rmsnorm_forward(f32(N, d), f32(N), f32(N, d), f32(d), 1e-5)
        rmsnorm.rmsnorm_backward(
            f32(N, d), f32(d), f32(N, d), f32(N, d), f32(N, d), f32(d), f32(N), True, f32(3, d)
        )
    bf16 = lambda *s: np.zeros(s, np.uint16)  # noqa: E731  (bf16 bits, euler.precision)
    for d in (256, 768):  # bf16 rows held in registers (rmsnorm.py): 1 and 3 strips
        rmsnorm.rmsnorm_forward(bf16(N, d), f32(N), f32(N, d), f32(d), 1e-5)
        rmsnorm.rmsnorm_backward(
            bf16(N, d), f32(d), f32(N, d), bf16(N, d), f32(N, d), f32(d), f32(N), True, f32(3, d)
        )
    for d in (D, D - 1):  # rows of 8-element 16-byte pieces (vector.py), and not
        rmsnorm.rmsnorm_forward(bf16(N, d), f32(N), f32(N, d), f32(d), 1e-5)
        rmsnorm.rmsnorm_backward(
            bf16(N, d), f32(d), f32(N, d), bf16(N, d), f32(N, d), f32(d), f32(N), True, f32(3, d)
        )
        swiglu.swiglu_forward(bf16(N, d), bf16(N, 2 * d))
        swiglu.swiglu_backward(bf16(N, 2 * d), bf16(N, d), bf16(N, 2 * d))
        embedding.embedding_backward(f32(V, d), bf16(N, d), tokens, True)
    rope.rope_forward(f32(B, T, 8 * 6), f32(T, 3), f32(T, 3), 4, 2, 6)  # 3 pairs: scalar path
    # 16-byte pieces, but a row's heads outgrow 4 threads: the generic kernel
    rope.rope_forward(f32(B, T, 8 * 16), f32(T, 8), f32(T, 8), 4, 2, 16, threads=4)
    transpose.transpose(f32(D, N), f32(N, D))
    cross_entropy.cross_entropy_forward(f32(N), f32(N, V), tokens)
    cross_entropy.cross_entropy_forward_backward(f32(N), f32(N, V), tokens, np.ones(K), 1)
    cross_entropy.loss_sum(np.zeros(1), f32(K, N), np.ones(K))
    host = SimpleNamespace(to_device=lambda a: a, zeros=np.zeros, stream=0)
    host.matmul_batched = lambda *a, **k: None
    naive = naive_attention.NaiveAttention(host, f32(B, T, 3 * 8), f32(B, T, 8), 1, 1, 8)
    naive.forward()
    naive.backward()
    P = 100
    stats, partial = np.zeros(2), np.zeros(4)
    adamw.grad_norm(stats, partial, f32(P), 1.0)
    for p in (P, P + 1):  # 16-byte pieces (vector.py), and not
        hyper = np.ones(3)
        adamw.adamw_update(f32(p), f32(p), f32(p), f32(p), stats, hyper, 0.9, 0.95, 1e-8, 0.1, 50)
    _bf16_rope_ce_adamw_launches(B, T, N, K, tokens)
    # KV-cache decoding (decode.py): each row count's kernel shape, features a multiple of 4
    # (V + 2 = 12) and not (V)
    for n, M in ((1, V), (N, V), (9, V), (9, V + 2)):
        decode.linear_rows(f32(n, M), f32(n, D), f32(M, D))
    S, C, H, G, E = 2, 5, 4, 2, 8
    at = np.zeros(N, np.int32)
    decode.attention_decode(f32(N, H * E), f32(N, (H + 2 * G) * E), f32(S, G, C, E),
                            f32(S, G, C, E), at, at, H, G, E)  # fmt: skip
    for E, tile in ((64, 0), (32, 0), (5, 0), (8, 4)):
        # the readable kernels (attention.py) at the `gpu` and `small` presets' head sizes,
        # at a head size that is not a multiple of 8, and with a tile size forced (tests)
        _attention_launches(E, tile, B, T)
    # the tensor-core backward's prep (D and dQ's zeros), which attention.py keeps for it
    H, G, E = 4, 2, 8
    attention.backward_prep(f32(B, T, (H + 2 * G) * E), f32(B, H, T), f32(B, T, H * E),
                            f32(B, T, H * E), H, E)  # fmt: skip
    return calls


def _bf16_rope_ce_adamw_launches(B: int, T: int, N: int, K: int, tokens) -> None:
    """The bf16 RoPE, cross-entropy and AdamW kernels in the dtypes the model passes them
    (euler.precision.BF16_TENSORS), on their 16-byte paths and their scalar kernels."""
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    bf16 = lambda *s: np.zeros(s, np.uint16)  # noqa: E731
    for E in (16, 6):  # 8 pairs a thread, and 3 pairs: the scalar kernel
        cs, shape = f32(T, E // 2), (B, T, 8 * E)
        rope.rope_forward(bf16(*shape), cs, cs, 4, 2, E)
        rope.rope_backward(f32(*shape), cs, cs, 4, 2, E, out=bf16(*shape))
    # one kernel each for rows of 16-byte pieces and not (a flag)
    cross_entropy.cross_entropy_forward(f32(N), bf16(N, 16), tokens)
    cross_entropy.cross_entropy_forward_backward(f32(N), bf16(N, 16), tokens, np.ones(K), 1)
    stats, hyper = np.zeros(2), np.ones(3)
    for P in (100, 101):  # 4 a thread, and the scalar kernel
        args = (f32(P), f32(P), f32(P), f32(P), stats, hyper, 0.9, 0.95, 1e-8, 0.1, 50)
        adamw.adamw_update(*args, lowp=bf16(P))


def _attention_launches(E: int, tile: int, B: int, T: int) -> None:
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    H, G = 4, 2
    qkv = f32(B, T, (H + 2 * G) * E)
    rope.rope_forward(qkv, f32(T, E // 2), f32(T, E // 2), H, G, E)
    attention.attention_forward(f32(B, T, H * E), f32(B, H, T), qkv, H, G, E, 0, tile)
    attention.attention_backward(
        f32(*qkv.shape), f32(B, T, H * E), qkv, f32(B, T, H * E), f32(B, H, T), H, G, E,
        f32(B, H, T), 0, tile,
    )  # fmt: skip


def _compile_all(monkeypatch, calls) -> None:
    """Compile every recorded launch's kernel to sm_90 PTX; no float64 where none is meant."""
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(
        compute_capability=(9, 0)
    ))  # fmt: skip
    seen = set()
    for kernel, args in calls:
        sig = tuple(numba.typeof(a) for a in args)
        name = kernel.py_func.__name__
        if (kernel, sig) in seen:
            continue
        seen.add((kernel, sig))
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".target sm_90" in ptx, name
        if name.endswith(("_vec_kernel", "_rows_kernel")):  # 16-byte accesses (vector.py)
            assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx, name
        if name.endswith("_vec_bf16_kernel"):
            # bf16 rows by 16-byte pieces of 8 (vector.py), its device functions inlined,
            # never an element at a time
            assert "ld.global.v4." in ptx, name
            assert "st.global.v4.u32" in ptx or "red.global.add.v4.f32" in ptx, name
            assert not re.search(r"\bcall(\.uni)?\b", ptx), name
            assert not re.search(r"\b(ld|st)\.global\.[bu]16\b", ptx), name
        if name in BF16_ACCESSES:  # bf16 16-byte pieces; device functions inlined
            for op in BF16_ACCESSES[name]:
                assert op in ptx, f"{name}{sig}: no {op}"
            assert not re.search(r"\bcall(\.uni)?\b", ptx), name
            if name == "rope_rows_bf16_kernel" and sig[1].dtype == numba.uint16:
                assert "ld.global.v4.u32" in ptx, name  # the forward's bf16 source
        if name == "transpose_kernel":  # whole tiles by 16-byte pieces (transpose.py)
            assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx, name
        if name == "rope_rows_kernel":  # rope.rotate4 inlined: one straight run, no call
            assert not re.search(r"\bcall(\.uni)?\b", ptx), name
        if name == "backward_prep_kernel":  # 16-byte chunks, no index divided (its docstring)
            assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx, name
            assert not re.search(r"\b(div|rem)\.[su]\d+", ptx), name
        if name not in F64_ALLOWED:
            bad = [line.strip() for line in ptx.splitlines() if F64_OP.search(line)]
            if name in F64_SCALAR_READS:
                bad = [line for line in bad if not F64_READ.match(line)]
            assert not bad, f"{name}{sig}: float64 in PTX: {bad[:3]}"


if IN_BACKGROUND:  # conftest.py's run of this file, beside the session on the other core

    def test_every_kernel_compiles_for_sm90(monkeypatch) -> None:
        calls = _launches(monkeypatch)
        _compile_all(monkeypatch, calls)
        launched = {k.py_func.__name__ for k, _ in calls}
        defined = {"forward_kernel", "backward_dq_kernel", "backward_dkv_kernel"}  # attention's
        modules = (adamw, attention, cross_entropy, decode, embedding, memory, naive_attention)
        modules += (residual,)
        modules += (rmsnorm, rope, swiglu, transpose)
        for module in modules:
            for name, obj in vars(module).items():
                if isinstance(obj, dispatcher.CUDADispatcher) and not obj.targetoptions["device"]:
                    defined.add(name)
        assert defined <= launched, f"kernels never compiled here: {sorted(defined - launched)}"

else:
    from tests.background import background_test

    test_ptx_in_background = background_test(
        __file__,
        "not slow",
        False,
        "This file's PTX compiles, in a subprocess started by conftest.py.",
    )
