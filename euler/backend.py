"""The backend interface: every kernel the model, the trainer, inference and bench call.

euler.cpu.backend.CpuBackend (NumPy arrays, BLAS, prange kernels) and
euler.gpu.backend.GpuBackend (numba device arrays, cuBLAS, numba.cuda kernels) implement
Backend with the same parameter names, order and defaults (tests/test_backend_interface.py
holds them to it). Arguments go outputs, saved statistics, inputs, weights, sizes. Arrays are
the backend's own (`Array`), float32 or float64 unless named int32; N counts rows (tokens),
D the model width, V the vocabulary, F the MLP hidden width, H query heads, G key/value
heads, E the head size, K the prediction heads. Shapes that a kernel would overrun raise
ValueError (check_shapes).

Every float array is float32 (float64 for the gradient check) or bf16, stored as uint16
bits (euler.precision.BF16). A method reads each array's dtype: bf16 inputs are widened
to float32 for the arithmetic, bf16 outputs rounded to nearest even where they are
stored; accumulation is float32 throughout. Which tensors are bf16 under --precision bf16
is euler.precision.BF16_TENSORS; the two operands of a product share a dtype.

Capabilities that only some backends have are declared here, with the honest answer where
absent: can_capture (CUDA graphs; capture refuses without it), kv_cache (the decode_*
methods; they refuse without it, and inference recomputes the context instead),
free_memory and peak_memory (None where the device does not report them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, SupportsFloat, runtime_checkable

import numpy as np

from euler.errors import EulerError
from euler.precision import check_precision

Array = Any  # np.ndarray on the CPU, a numba DeviceNDArray on the GPU


class Product(NamedTuple):
    """One product of a matmul_pair, named as matmul takes its arguments:
    out = (or += with accumulate) op(a) @ op(b), op an optional transpose."""

    out: Array
    a: Array
    b: Array
    trans_a: bool = False
    trans_b: bool = False
    accumulate: bool = False


def check_shapes(where: str, **checks: tuple[Any, Sequence[int]]) -> None:
    """Each name=(array, expected shape): ValueError naming `where`, the first array whose
    shape differs, its shape and the expected one (Numba kernels do not check bounds)."""
    for name, (a, want) in checks.items():
        if tuple(a.shape) != tuple(want):
            raise ValueError(f"{where}: {name} has shape {tuple(a.shape)}, expected {tuple(want)}")


@runtime_checkable
class Backend(Protocol):
    """What euler.model, euler.training, euler.inference and euler.bench call on a backend."""

    name: str  # "cpu" or "cuda"
    can_capture: bool  # whether capture() records CUDA graphs (a real GPU, a real cuBLAS)
    kv_cache: bool  # whether the decode_* methods exist (else inference recomputes)

    # ------------------------------------------------------------ memory
    def zeros(self, shape: Sequence[int], dtype) -> Array:
        """A new zero-filled array of shape and dtype on the device."""

    def to_device(self, a: np.ndarray) -> Array:
        """A device copy of host array a (on the CPU: a itself, made C-contiguous)."""

    def to_host(self, a: Array) -> np.ndarray:
        """Host copy of device array a; waits for the work that writes it."""

    def copy_(self, dst: Array, src: Array | np.ndarray) -> None:
        """dst[...] = src, src a device or host array of dst's shape, in stream order."""

    def synchronize(self) -> None:
        """Wait until every kernel enqueued so far has finished."""

    def stage_scalars(self, name: str, values: Sequence[float]) -> Array:
        """values (n,) as float64 in a fixed buffer `name`, refilled in place on every call."""

    def release_unused(self) -> None:
        """Free device buffers nothing refers to any more (nothing to do where frees are
        immediate)."""

    def free_memory(self) -> int | None:
        """Bytes of device memory free now; None where the device does not say (the CPU)."""

    def peak_memory(self) -> tuple[int, int] | None:
        """(bytes of device memory in use now, total bytes); None where unknown (the CPU)."""

    # ------------------------------------------------------------ matrix products
    def matmul(
        self, out: Array, a: Array, b: Array, trans_a: bool = False, trans_b: bool = False,
        accumulate: bool = False,
    ) -> None:  # fmt: skip
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=); op an optional transpose."""

    def matmul_residual(self, out: Array, res: Array, a: Array, b: Array) -> None:
        """out (M, N) = res (M, N) + a (M, K) @ b (N, K)^T; out may not overlap res."""

    def matmul_pair(self, first: Product, second: Product) -> None:
        """Two independent products; second may run beside later work until wait_deferred."""

    def wait_deferred(self, keep: int = 0) -> None:
        """Later work waits for every deferred product but the newest `keep`."""

    # ------------------------------------------------------------ layers
    def embedding_forward(self, x: Array, tokens: Array, wte: Array) -> None:
        """x (N, D) = wte (V, D)[tokens (N,) int32]."""

    def embedding_backward(self, dwte: Array, dx: Array, tokens: Array, accumulate: bool) -> None:
        """dwte (V, D) = or += the rows of dx (N, D) scattered by tokens (N,) int32."""

    def rmsnorm_forward(self, y: Array, rstd: Array, x: Array, w: Array, eps: float) -> None:
        """y (N, D) = x (N, D) * rstd * w (D,); rstd (N,) = 1 / sqrt(mean(x^2) + eps) saved."""

    def rmsnorm_backward(
        self, dx: Array, dw: Array, dy: Array, dres: Array, x: Array, w: Array, rstd: Array,
        accumulate: bool,
    ) -> None:  # fmt: skip
        """dx (N, D) = dres + J^T dy (dx may be dres); dw (D,) = or += its weight gradient."""

    def rope_forward(
        self, qkv: Array, cos: Array, sin: Array, H: int, G: int, E: int, pos0: int = 0
    ) -> None:
        """Rotate the q and k heads of qkv (B, T, (H + 2G) E) in place for positions
        pos0..pos0+T-1; cos, sin (context, E/2)."""

    def rope_backward(
        self, dqkv: Array, cos: Array, sin: Array, H: int, G: int, E: int, pos0: int = 0,
        out: Array | None = None,
    ) -> None:  # fmt: skip
        """Rotate the q and k gradients of dqkv (B, T, (H + 2G) E) back, in place; with out
        (dqkv's shape; bf16 where dqkv is float32), into out, dqkv only read."""

    def attention_forward(self, out: Array, lse: Array, qkv: Array, H: int, G: int, E: int) -> None:
        """Causal attention: out (B, T, H E) and log-sum-exp lse (B, H, T) from qkv
        (B, T, (H + 2G) E); query head h reads key/value head h // (H / G)."""

    def attention_backward(
        self, dqkv: Array, dout: Array, qkv: Array, out: Array, lse: Array, H: int, G: int, E: int
    ) -> None:
        """dqkv (B, T, (H + 2G) E) from dout (B, T, H E) and the forward's qkv, out, lse."""

    def swiglu_forward(self, h: Array, gu: Array) -> None:
        """h (N, F) = silu(gate) * up, gu (N, 2F) = gate | up."""

    def swiglu_backward(self, dgu: Array, dh: Array, gu: Array) -> None:
        """dgu (N, 2F) from dh (N, F) and the forward's gu (N, 2F)."""

    def residual_forward(self, out: Array, a: Array, b: Array) -> None:
        """out = a + b, all (N, D); out may be a or b."""

    def cross_entropy_forward(self, losses: Array, logits: Array, targets: Array) -> None:
        """losses (N,) in nats from logits (N, V) and targets (N,) int32 (-1: none, loss 0)."""

    def cross_entropy_forward_backward(
        self, losses: Array, logits: Array, targets: Array, scales: Array, k: int
    ) -> None:
        """losses (N,); logits (N, V) become scales[k] * dloss/dlogits, scales staged (K,)."""

    def loss_value(self, losses: Array, head_scale: Array) -> SupportsFloat:
        """sum_k head_scale[k] * sum(losses[k]) for losses (K, N), in float64; float() of
        the result waits for the device."""

    # ------------------------------------------------------------ optimizer
    def grad_norm(self, grads: Array) -> float:
        """Global L2 norm of the flat gradient (P,) (waits for the device)."""

    def adamw_step(
        self, params: Array, grads: Array, m: Array, v: Array, hp, hyper: Array, n_decay: int,
        lowp: Array | None = None,
    ) -> SupportsFloat:  # fmt: skip
        """Clip grads (P,) by global norm to hp.grad_clip, then AdamW on params, m, v (P,) in
        place, weight decay on [0, n_decay); hyper the staged (lr, 1 - beta1^t, 1 - beta2^t).
        lowp (P,) bf16, if given, receives the new params rounded to bf16 in the same pass.
        Returns the norm before clipping."""

    # ------------------------------------------------------------ CUDA graphs
    def capture(self, fn: Callable[[], object]) -> tuple[Any, object]:
        """(graph of the work fn() enqueues, fn's result); EulerError without can_capture."""

    # ------------------------------------------------------------ decoding with a KV cache
    # Decoding runs the model's forward (Model.layers) with a KV cache over n rows, each a
    # token of one of S sequences: the layer methods above (rope_forward with tables
    # gathered at the rows' positions, residual_forward after each product), these two in
    # place of the products and attention. Each row is computed alone: its result does not
    # depend on which or how many rows share the call.
    def decode_linear(self, out: Array, x: Array, w: Array) -> None:
        """out (n, M) = x (n, D) @ w (M, D)^T, each row alone. EulerError without kv_cache."""

    def decode_attention(
        self, out: Array, qkv: Array, k_cache: Array, v_cache: Array, slots: Array,
        positions: Array, H: int, G: int, E: int,
    ) -> None:  # fmt: skip
        """Write the keys and values of qkv (n, (H + 2G) E) (RoPE applied) into k_cache,
        v_cache (S, G, C, E) at slot slots[r], position positions[r] of each row r (n,)
        int32, then out (n, H E): row r attends to its slot's positions 0..positions[r]
        (this call's rows included). EulerError without kv_cache."""


def make_backend(device: str, precision: str = "tf32", exact_attention: bool = False) -> Backend:
    """The CpuBackend or GpuBackend for --device (cpu or cuda) and --precision (fp32, tf32,
    bf16; euler.precision); one-line errors without a GPU, or without bf16 on it.

    On the GPU, fp32 makes every product and attention exact, tf32 runs them on TF32 tensor
    cores (exact_attention: attention in fp32), and bf16 runs bf16 products and attention
    (the model stores bf16 tensors; the backend reads their dtype). On the CPU every
    precision computes in fp32; bf16's tensors are emulated (euler.cpu.backend).
    """
    check_precision(precision)
    if device == "cpu":
        from euler.cpu.backend import CpuBackend

        return CpuBackend()
    try:
        from euler.gpu.backend import GpuBackend, check_bf16_support
    except ImportError as e:
        raise EulerError(f"--device cuda: the GPU backend cannot be imported ({e})") from None
    if precision == "bf16":
        check_bf16_support()
    return GpuBackend(tf32=precision != "fp32", tc_attention=not exact_attention)
