"""The CPU backend: NumPy arrays, BLAS matrix products, prange kernels.

It implements euler.backend.Backend, as the GPU's does, so euler.model.transformer runs
unchanged on either device. Its capabilities: a KV cache for generation (the decode_*
methods, euler/cpu/decode.py), no CUDA graphs, no device-memory figures (None).

bf16 tensors (uint16 bits, euler.precision) are emulated: a method given one widens it to
float32, runs the float32 kernel, and rounds each bf16 output to nearest even once, where
the GPU's kernel stores it. Products of bf16 operands are exact in float32, so a product
accumulates in float32 as cuBLAS's does. It is the reference the GPU's bf16 kernels are
compared with, and slow (every bf16 argument is copied twice).
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from euler.backend import check_shapes
from euler.cpu import (
    adamw,
    attention,
    attention_dense,
    cross_entropy,
    decode,
    embedding,
    residual,
    rmsnorm,
    rope,
    swiglu,
)
from euler.cpu.attention_dense import DENSE_MAX_T
from euler.cpu.bf16 import narrow_into, widen
from euler.cpu.blas import ProductPlan, Products
from euler.errors import EulerError
from euler.layer_math import clip_scale
from euler.precision import is_bf16


def _bf16_emulated(*outputs: str):
    """Decorate a method so that it takes bf16 arrays: each is widened to a float32 copy
    (one copy per distinct array, so `dx` passed as `dres` too stays one buffer), the
    float32 method runs, and the copies of the arguments named in `outputs` are rounded
    back into their bf16 arrays."""

    def wrap(method):
        signature = inspect.signature(method)

        @functools.wraps(method)
        def emulated(self, *args, **kwargs):
            values = (*args, *kwargs.values())
            if not any(isinstance(v, np.ndarray) and is_bf16(v) for v in values):
                return method(self, *args, **kwargs)  # float32: no binding in the hot path
            bound = signature.bind(self, *args, **kwargs)
            originals = dict(bound.arguments)
            wide: list[tuple[np.ndarray, np.ndarray]] = []  # (bf16 array, its float32 copy)
            for name, value in bound.arguments.items():
                if isinstance(value, np.ndarray) and is_bf16(value):
                    copy = next((w for a, w in wide if a is value), None)
                    if copy is None:
                        copy = widen(value)
                        wide.append((value, copy))
                    bound.arguments[name] = copy
            result = method(*bound.args, **bound.kwargs)
            for name in outputs:
                original = originals.get(name)
                if isinstance(original, np.ndarray) and is_bf16(original):
                    narrow_into(original, bound.arguments[name])
            return result

        return emulated

    return wrap


class CpuBackend:
    """Schedules the shared layer math on the CPU; the reference the GPU is tested against."""

    name = "cpu"
    can_capture = False  # no CUDA graphs: every step runs as it is
    kv_cache = True  # decode_linear and decode_attention exist

    def __init__(self, attention_tile: int | None = None, plan: ProductPlan | None = None):
        # Sequences up to DENSE_MAX_T run dense (whole score blocks through BLAS), longer ones
        # FlashAttention in tiles of attention.TILE keys. A given tile asks for FlashAttention
        # at every length: the gradient check uses small tiles so that its short sequences
        # cross several tile boundaries.
        self.attention_tile = attention.TILE if attention_tile is None else attention_tile
        self.dense_max_t = DENSE_MAX_T if attention_tile is None else 0
        self._matmul = Products(plan)  # how products are cut into blocks (euler/cpu/blas.py)
        self._scalars: dict[str, np.ndarray] = {}
        self._scratch: dict[tuple, np.ndarray] = {}

    # ------------------------------------------------------------ memory
    def zeros(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def to_device(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def copy_(self, dst, src) -> None:
        """dst[...] = src (src may be a host array)."""
        np.copyto(dst, src)

    def synchronize(self) -> None:
        """Nothing to wait for: CPU kernels return when done."""

    def release_unused(self) -> None:
        """Nothing to release: NumPy frees an array when the last reference goes."""

    def free_memory(self) -> None:
        """None: host memory is not the device's to report (the trainer checks nothing)."""
        return None

    def peak_memory(self) -> None:
        """None: no device-memory figures on the CPU (bench reports the peak RSS instead)."""
        return None

    # ------------------------------------------------------------ matrix products
    @_bf16_emulated("out")
    def matmul(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=); op is an optional transpose."""
        self._matmul(out, a, b, trans_a, trans_b, accumulate)

    @_bf16_emulated("out")
    def matmul_residual(self, out, res, a, b) -> None:
        """out (M, N) = res (M, N) + a (M, K) @ b^T, b a weight (N, K); out may not overlap res.

        The product into a reused scratch buffer, then the residual add: the GPU's unfused
        path, and the rounding of a product followed by an add.
        """
        if np.may_share_memory(out, res):
            raise ValueError("matmul_residual: out may not overlap res")
        key = (tuple(out.shape), out.dtype.str)
        tmp = self._scratch.get(key)
        if tmp is None:
            tmp = self._scratch[key] = np.empty(out.shape, out.dtype)
        self.matmul(tmp, a, b, trans_b=True)
        self.residual_forward(out, res, tmp)

    def matmul_pair(self, first, second) -> None:
        """Two independent products, each (out, a, b, trans_a, trans_b, accumulate), in one
        parallel loop; both are done when it returns (bf16 operands widened first)."""
        if not any(is_bf16(x) for x in (*first[:3], *second[:3])):
            self._matmul.pair(first, second)
            return
        wide = [tuple(widen(x) if is_bf16(x) else x for x in p[:3]) + p[3:]
                for p in (first, second)]  # fmt: skip
        self._matmul.pair(*wide)
        for p, w in zip((first, second), wide, strict=True):
            if is_bf16(p[0]):
                narrow_into(p[0], w[0])

    def wait_deferred(self, keep: int = 0) -> None:
        """The GPU's fence for its side-stream products; the CPU's are done when pair returns."""

    # ------------------------------------------------------------ layers
    # Numba does not check bounds, so each launcher checks the shapes its kernel trusts.
    @_bf16_emulated("x")
    def embedding_forward(self, x, tokens, wte) -> None:
        """x (N, D) = wte (V, D)[tokens (N,)]."""
        check_shapes("embedding_forward", tokens=(tokens, x.shape[:1]),
                     x=(x, (x.shape[0], wte.shape[1])))  # fmt: skip
        embedding.embedding_forward(x, tokens, wte)

    @_bf16_emulated("dwte")
    def embedding_backward(self, dwte, dx, tokens, accumulate) -> None:
        """dwte (V, D) (+)= scatter of dx (N, D) by tokens (N,)."""
        check_shapes("embedding_backward", tokens=(tokens, dx.shape[:1]),
                     dx=(dx, (dx.shape[0], dwte.shape[1])))  # fmt: skip
        embedding.embedding_backward(dwte, dx, tokens, accumulate)

    @_bf16_emulated("y")
    def rmsnorm_forward(self, y, rstd, x, w, eps) -> None:
        """y (N, D), rstd (N,) from x (N, D), w (D,)."""
        check_shapes("rmsnorm_forward", y=(y, x.shape), rstd=(rstd, x.shape[:1]),
                     w=(w, x.shape[1:]))  # fmt: skip
        rmsnorm.rmsnorm_forward(y, rstd, x, w, eps)

    @_bf16_emulated("dx")
    def rmsnorm_backward(self, dx, dw, dy, dres, x, w, rstd, accumulate) -> None:
        """dx (N, D) = dres + J^T dy; dw (D,) (+)=."""
        check_shapes("rmsnorm_backward", dx=(dx, x.shape), dy=(dy, x.shape), dres=(dres, x.shape),
                     dw=(dw, w.shape), w=(w, x.shape[1:]), rstd=(rstd, x.shape[:1]))  # fmt: skip
        inplace = np.may_share_memory(dx, dres)
        rmsnorm.rmsnorm_backward(dx, dw, dy, dres, x, w, rstd, accumulate, inplace)

    @_bf16_emulated("qkv")
    def rope_forward(self, qkv, cos, sin, H, G, E, pos0=0) -> None:
        """Rotate the q and k heads of qkv (B, T, (H + 2G) E) in place."""
        _rope_shapes(qkv, cos, sin, H, G, E, pos0)
        rope.rope_forward(qkv, cos, sin, H, G, E, pos0)

    def rope_backward(self, dqkv, cos, sin, H, G, E, pos0=0, out=None) -> None:
        """Rotate the q and k gradients of dqkv (B, T, (H + 2G) E) back, in place; with out
        (dqkv's shape, float32 or bf16), into out instead, dqkv left as it is."""
        _rope_shapes(dqkv, cos, sin, H, G, E, pos0)
        if out is None:
            rope.rope_backward(dqkv, cos, sin, H, G, E, pos0)
            return
        check_shapes("rope_backward", out=(out, dqkv.shape))
        work = widen(dqkv) if is_bf16(dqkv) else np.array(dqkv, dtype=np.float32)
        rope.rope_backward(work, cos, sin, H, G, E, pos0)
        if is_bf16(out):
            narrow_into(out, work)
        else:
            out[...] = work

    @_bf16_emulated("out")
    def attention_forward(self, out, lse, qkv, H, G, E) -> None:
        """out (B, T, H E), lse (B, H, T) from qkv (B, T, (H + 2G) E)."""
        B, T = qkv.shape[:2]
        check_shapes("attention_forward", qkv=(qkv, (B, T, (H + 2 * G) * E)),
                     out=(out, (B, T, H * E)), lse=(lse, (B, H, T)))  # fmt: skip
        if T <= self.dense_max_t:
            attention_dense.attention_forward(out, lse, qkv, H, G, E)
        else:
            attention.attention_forward(out, lse, qkv, H, G, E, self.attention_tile)

    @_bf16_emulated("dqkv")
    def attention_backward(self, dqkv, dout, qkv, out, lse, H, G, E) -> None:
        """dqkv (B, T, (H + 2G) E) from dout (B, T, H E) and the saved qkv, out, lse."""
        B, T = qkv.shape[:2]
        check_shapes("attention_backward", qkv=(qkv, (B, T, (H + 2 * G) * E)),
                     dqkv=(dqkv, qkv.shape), lse=(lse, (B, H, T)), out=(out, (B, T, H * E)),
                     dout=(dout, (B, T, H * E)))  # fmt: skip
        if T <= self.dense_max_t:
            attention_dense.attention_backward(dqkv, dout, qkv, out, lse, H, G, E)
        else:
            attention.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, self.attention_tile)

    @_bf16_emulated("h")
    def swiglu_forward(self, h, gu) -> None:
        """h (N, F) = silu(gate) * up from gu (N, 2F)."""
        check_shapes("swiglu_forward", gu=(gu, (h.shape[0], 2 * h.shape[1])))
        swiglu.swiglu_forward(h, gu)

    @_bf16_emulated("dgu")
    def swiglu_backward(self, dgu, dh, gu) -> None:
        """dgu (N, 2F) from dh (N, F) and gu (N, 2F)."""
        check_shapes("swiglu_backward", gu=(gu, (dh.shape[0], 2 * dh.shape[1])),
                     dgu=(dgu, gu.shape))  # fmt: skip
        swiglu.swiglu_backward(dgu, dh, gu)

    @_bf16_emulated("out")
    def residual_forward(self, out, a, b) -> None:
        """out (N, D) = a + b."""
        check_shapes("residual_forward", a=(a, out.shape), b=(b, out.shape))
        residual.residual_forward(out, a, b)

    @_bf16_emulated("losses")
    def cross_entropy_forward(self, losses, logits, targets) -> None:
        """losses (N,) from logits (N, V) and targets (N,) (-1 = none)."""
        _cross_entropy_shapes("cross_entropy_forward", losses, logits, targets)
        cross_entropy.cross_entropy_forward(losses, logits, targets)

    @_bf16_emulated("logits")
    def cross_entropy_forward_backward(self, losses, logits, targets, scales, k) -> None:
        """losses (N,); logits (N, V) becomes scales[k] * dloss/dlogits (scales staged, (K,))."""
        _cross_entropy_shapes("cross_entropy_forward_backward", losses, logits, targets)
        cross_entropy.cross_entropy_forward_backward(losses, logits, targets, float(scales[k]))

    def stage_scalars(self, name: str, values) -> np.ndarray:
        """values (n,) as float64 in the buffer `name`, refilled in place on every call.

        As on the GPU, a consumer holding the buffer sees the latest values (a recorded step
        replays with the current learning rate).
        """
        values = np.asarray(values, dtype=np.float64)
        buf = self._scalars.get(name)
        if buf is None or buf.shape != values.shape:
            buf = self._scalars[name] = np.empty(values.shape, np.float64)
        buf[...] = values
        return buf

    def loss_value(self, losses, head_scale) -> float:
        """sum_k head_scale[k] * sum(losses[k]) for losses (K, N), in float64."""
        return float(np.dot(losses.astype(np.float64).sum(axis=1), head_scale))

    # ------------------------------------------------------------ optimizer
    def grad_norm(self, grads) -> float:
        """Global L2 norm of the flat gradient."""
        return math.sqrt(adamw.grad_sumsq(grads))

    def adamw_step(self, params, grads, m, v, hp, hyper, n_decay, lowp=None) -> float:
        """Clip by global norm, then AdamW in place; returns the norm before clipping.

        hyper: the staged (lr, 1 - beta1^step, 1 - beta2^step). lowp (P,) bf16, if given,
        receives the updated parameters rounded to bf16 (the products' weight copies).
        """
        check_shapes("adamw_step", grads=(grads, params.shape), m=(m, params.shape),
                     v=(v, params.shape))  # fmt: skip
        norm = self.grad_norm(grads)
        scale = clip_scale(norm, hp.grad_clip)
        lr, bc1, bc2 = (float(h) for h in hyper)
        adamw.adamw_update(
            params, grads, m, v, lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, bc1, bc2,
            scale, n_decay,
        )  # fmt: skip
        if lowp is not None:
            check_shapes("adamw_step", lowp=(lowp, params.shape))
            narrow_into(lowp, params)
        return norm

    # ------------------------------------------------------------ CUDA graphs
    def capture(self, fn):
        """Refused: the CPU records no CUDA graphs (can_capture is False)."""
        raise EulerError("CPU backend: no CUDA graphs to capture (can_capture is False)")

    # ------------------------------------------------------------ decoding with a KV cache
    def decode_linear(self, out, x, w) -> None:
        """out (n, M) = x (n, D) @ w (M, D)^T, every element a dot product of its own (not
        BLAS, whose blocking depends on n), so a row's result is bit-identical whatever rows
        share the call: batched and speculative decoding stay exact."""
        check_shapes("decode_linear", x=(x, (out.shape[0], w.shape[1])),
                     out=(out, (x.shape[0], w.shape[0])))  # fmt: skip
        decode.linear_rows(out, x, w)

    def decode_attention(self, out, qkv, k_cache, v_cache, slots, positions, H, G, E) -> None:
        """Write qkv (n, (H + 2G) E)'s keys and values into k_cache, v_cache (S, G, C, E) at
        (slots[r], positions[r]) for each row r, then out (n, H E): row r attends to its
        slot's positions 0..positions[r]; slots and positions (n,) int32."""
        n = qkv.shape[0]
        S, C = (k_cache.shape[0], k_cache.shape[2]) if k_cache.ndim == 4 else (-1, -1)
        check_shapes("decode_attention", qkv=(qkv, (n, (H + 2 * G) * E)), out=(out, (n, H * E)),
                     k_cache=(k_cache, (S, G, C, E)), v_cache=(v_cache, (S, G, C, E)),
                     slots=(slots, (n,)), positions=(positions, (n,)))  # fmt: skip
        if slots.dtype != np.int32 or positions.dtype != np.int32:
            raise ValueError("decode_attention: slots and positions must be int32")
        if n and (positions.min() < 0 or positions.max() >= C):
            raise ValueError(f"decode_attention: positions {positions.min()}..{positions.max()} "
                             f"outside the cache's {C}")  # fmt: skip
        if n and (slots.min() < 0 or slots.max() >= S):
            raise ValueError(f"decode_attention: slots {slots.min()}..{slots.max()} outside the "
                             f"cache's {S}")  # fmt: skip
        if G < 1 or H % G:
            raise ValueError(f"decode_attention: G={G} key/value heads do not divide H={H}")
        decode.attention_decode(out, qkv, k_cache, v_cache, slots, positions, H, G, E)


def _cross_entropy_shapes(where: str, losses, logits, targets) -> None:
    N = logits.shape[0]
    check_shapes(where, logits=(logits, (N, logits.shape[-1])), losses=(losses, (N,)),
                 targets=(targets, (N,)))  # fmt: skip


def _rope_shapes(qkv, cos, sin, H, G, E, pos0) -> None:
    B, T = qkv.shape[:2]
    check_shapes("rope", qkv=(qkv, (B, T, (H + 2 * G) * E)), sin=(sin, cos.shape))
    if cos.shape[1] != E // 2 or pos0 < 0 or pos0 + T > cos.shape[0]:
        raise ValueError(f"rope: tables {cos.shape} do not cover positions {pos0}..{pos0 + T - 1}")
