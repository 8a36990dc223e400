"""The GPU backend: numba device arrays, cuBLAS matrix products, numba.cuda kernels.

It implements euler.backend.Backend, as the CPU's does. Everything runs on one
CUDA stream (cuBLAS is bound to it too), so launches are ordered without host waits;
only to_host, synchronize and float() of a returned DeviceScalar wait for the device.
The exception is matmul_pair's second product (a weight gradient): it goes to a side
stream with its own cuBLAS handle, forked from the stream and joined back by events
(wait_deferred), so it runs beside the backward's next kernels.
Scratch buffers (norm partials, attention's D_i and prep flags) belong to the backend,
allocated on first use at a given size and reused, so steps after the first allocate
nothing.
Capabilities: CUDA graphs (capture) on a real GPU with the real cuBLAS; KV-cache decoding
in float32 (the decode_* methods, euler/gpu/decode.py), batched across sequences as on the
CPU; bf16 decoding recomputes the context through the training forward instead
(euler/inference/decode_device.py).
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from euler.errors import EulerError
from euler.gpu.cublas import INSTALL_HINT, Cublas
from euler.gpu.cublaslt import CublasLt
from euler.gpu.options import GpuOptions
from euler.precision import check_bf16_capability, is_bf16

try:
    from numba import cuda
except ImportError:  # numba-cuda is the `gpu` extra
    cuda = None


def _require_gpu() -> None:
    """An EulerError naming what is missing: numba-cuda, or a usable CUDA GPU."""
    if cuda is None:
        raise EulerError(f"GPU backend: numba-cuda is not installed; {INSTALL_HINT}")
    try:
        available = cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken driver reads as "no GPU"
        available = False
    if not available:
        raise EulerError(
            f"GPU backend: no CUDA GPU found (driver or device missing); {INSTALL_HINT} "
            "on a machine with an NVIDIA GPU"
        )


def check_bf16_support() -> None:
    """EulerError unless the current GPU runs bf16 (compute capability 8.0 or later)."""
    _require_gpu()
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    check_bf16_capability(device.compute_capability, name)


SIMULATED_MULTIPROCESSORS = 4  # the simulator's device reports none; a few keep grids small


def multiprocessors() -> int:
    """The current device's multiprocessor count (SIMULATED_MULTIPROCESSORS in the simulator,
    whose device has no attributes): what block counts of grid-filling kernels scale with."""
    if numba.config.ENABLE_CUDASIM:
        return SIMULATED_MULTIPROCESSORS
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def _event():
    """A CUDA event for ordering only (no timestamps; the simulator's takes no options)."""
    return cuda.event() if numba.config.ENABLE_CUDASIM else cuda.event(timing=False)


CUBLAS_WORKSPACE = 32 * 2**20  # bytes; NVIDIA's suggestion for Hopper


def _on_stream(library, stream, tf32: bool, **kw):
    """A Cublas or CublasLt handle issuing on stream, with a workspace of its own (which it
    keeps): without one cuBLAS allocates its own, which a captured step cannot record. kw
    goes to the library (CublasLt's candidates and timer)."""
    workspace = cuda.device_array(CUBLAS_WORKSPACE, np.uint8, stream=stream)
    handle = int(getattr(stream.handle, "value", stream.handle))
    return library(handle, tf32=tf32, workspace=workspace, **kw)


TIMED_CALLS = 5  # calls timed together per candidate algorithm, after one untimed


class StreamTimer:
    """cublaslt.AlgoTimer on one stream of a backend: device time by CUDA events, after the
    whole device has drained (the side stream's work would share the GPU); none while the
    backend captures a graph."""

    def __init__(self, backend: GpuBackend, stream):
        self.backend, self.stream = backend, stream

    def scratch(self, shape: tuple, dtype):
        return cuda.device_array(shape, dtype, stream=self.stream)

    def time(self, run) -> float | None:
        if self.backend.capturing:
            return None
        cuda.synchronize()
        run()
        start, end = cuda.event(), cuda.event()
        start.record(self.stream)
        for _ in range(TIMED_CALLS):
            run()
        end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) / TIMED_CALLS


SIDE_EVENTS = 8  # deferred products that may be outstanding at once


class GpuBackend:
    """Schedules the shared layer math on one CUDA GPU, as `options` (GpuOptions) says;
    keyword arguments set its fields (GpuBackend(tf32=False) is
    GpuBackend(GpuOptions(tf32=False))). blas: a stand-in for cuBLAS (the simulator's tests
    pass one). Block counts that fill the device are taken from its multiprocessor count.
    """

    name = "cuda"
    kv_cache = True  # decode_linear and decode_attention exist (float32)

    def __init__(self, options: GpuOptions | None = None, blas=None, **fields):
        options = dataclasses.replace(options or GpuOptions(), **fields)
        _require_gpu()
        from euler.gpu import (
            adamw,
            attention,
            attention_tc,
            cross_entropy,
            decode,
            embedding,
            memory,
            residual,
            rmsnorm,
            rope,
            swiglu,
            transpose,
        )

        self.k_adamw, self.k_attention, self.k_ce = adamw, attention, cross_entropy
        self.k_embedding, self.k_residual, self.k_rmsnorm = embedding, residual, rmsnorm
        self.k_rope, self.k_swiglu, self.memory = rope, swiglu, memory
        self.k_transpose, self.k_decode = transpose, decode
        self.options = options
        self.threads, self.tile, tf32 = options.threads, options.tile, options.tf32
        # block counts from this device's multiprocessors
        sms = multiprocessors()
        self.rmsnorm_blocks = rmsnorm.PARTIAL_BLOCKS_PER_SM * sms
        self.norm_blocks = adamw.NORM_BLOCKS_PER_SM * sms
        tc = tf32 and options.tc_attention and not options.tile
        self.k_attention_tc = attention_tc if tc else None
        self.stream = cuda.stream()
        self.blas = _on_stream(Cublas, self.stream, tf32) if blas is None else blas
        # cuBLAS, or a stand-in for it (the simulator's, called in line on every stream)
        self._cublas = hasattr(self.blas, "set_workspace")
        # overlap: (side stream, its cuBLAS handle, fork event, events marking products done)
        self.side = None
        if options.overlap:
            side = cuda.stream()
            side_blas = _on_stream(Cublas, side, tf32) if self._cublas else blas
            done = [_event() for _ in range(SIDE_EVENTS)]
            self.side = (side, side_blas, _event(), done)
        self._side_pending: list = []  # events of the deferred products not yet waited for
        self._side_count = 0  # deferred products so far: their events go round the ring
        self._scratch: dict[tuple, object] = {}
        self._lt = None  # the stream's cuBLASLt (fused residuals, bf16 products), made on use
        self._side_lt = None  # the side stream's, for deferred bf16 products
        self.capturing = False  # inside capture(): nothing may be timed or waited for

    def settings(self) -> dict:
        """What this backend does, as flat JSON values: the options' fields, then what it
        took from the device (its name, multiprocessors and the block counts made of them)
        and whether a stand-in replaces cuBLAS. The banner prints it; run.json keeps it."""
        device = cuda.get_current_device()
        name = getattr(device, "name", None) or "simulator"  # the simulator's has none
        return {
            **dataclasses.asdict(self.options),
            "device": name.decode() if isinstance(name, bytes) else str(name),
            "multiprocessors": multiprocessors(),
            "rmsnorm_blocks": self.rmsnorm_blocks,
            "norm_blocks": self.norm_blocks,
            "cublas": self._cublas,
        }

    @property
    def can_capture(self) -> bool:
        """Whether capture() records CUDA graphs (step_graph.py): that needs the driver, so
        not under the simulator, and the real cuBLAS, not a stand-in."""
        return not numba.config.ENABLE_CUDASIM and self._cublas

    # ------------------------------------------------------------ memory
    def zeros(self, shape, dtype):
        """A zero-filled device array, filled in stream order."""
        return self.memory.device_zeros(shape, dtype, self.stream, self.threads)

    def to_device(self, a: np.ndarray):
        """A device copy of host array a, uploaded in stream order."""
        a = np.ascontiguousarray(a)
        out = self.zeros(a.shape, a.dtype)
        out.copy_to_device(a, stream=self.stream)
        return out

    def to_host(self, a) -> np.ndarray:
        """Host copy of device array a; waits for the stream."""
        host = a.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return host

    def copy_(self, dst, src) -> None:
        """dst[...] = src (src may be a host array, copied in dst's dtype).

        A host array goes through a pinned staging buffer: a copy from pageable memory
        would make the host wait until the stream has finished all earlier work.
        """
        if isinstance(src, np.ndarray):
            stage, done = self._staging(dst.shape, dst.dtype)
            done.synchronize()  # the last copy out of this buffer has been read
            np.copyto(stage, src.reshape(dst.shape), casting="same_kind")
            src = stage
            dst.copy_to_device(src, stream=self.stream)
            done.record(self.stream)
            return
        dst.copy_to_device(src, stream=self.stream)

    def _staging(self, shape, dtype):
        """(pinned host buffer, event recorded after its last upload) for this shape."""
        key = ("pinned", tuple(shape), np.dtype(dtype).str)
        if key not in self._scratch:
            done = _event()
            done.record(self.stream)
            self._scratch[key] = (cuda.pinned_array(shape, dtype), done)
        return self._scratch[key]

    def synchronize(self) -> None:
        """Wait for everything enqueued on the stream."""
        self.stream.synchronize()

    def stage_scalars(self, name: str, values):
        """values (n,) as float64 in the device buffer `name`, uploaded in stream order.

        The buffer's address stays fixed, so kernels captured into a CUDA graph read each
        step's values (learning rate, head scales) from it.
        """
        values = np.asarray(values, dtype=np.float64)
        buf = self.scratch(name, values.shape, np.float64)
        self.copy_(buf, values)
        return buf

    def scratch(self, name: str, shape, dtype):
        """A reusable device buffer for (name, shape, dtype), allocated on first use."""
        key = (name, tuple(shape), np.dtype(dtype).str)
        if key not in self._scratch:
            self._scratch[key] = self.zeros(shape, dtype)
        return self._scratch[key]

    def free_memory(self) -> int:
        """Bytes of device memory free now, as the driver reports."""
        return cuda.current_context().get_memory_info()[0]

    def release_unused(self) -> None:
        """Free device buffers nothing refers to any more (Numba defers their release)."""
        import gc

        gc.collect()
        cuda.current_context().deallocations.clear()

    def peak_memory(self) -> tuple[int, int]:
        """(bytes in use on the device now, total), as the driver reports."""
        free, total = cuda.current_context().get_memory_info()
        return total - free, total

    # ------------------------------------------------------------ matrix products
    def matmul(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (M, N) = op(a) @ op(b), assigned or accumulated (+=); op is an optional
        transpose. bf16 operands go to cuBLASLt (fp32 accumulation, out bf16 or fp32)."""
        self._library(a, side=False).gemm(out, a, b, trans_a, trans_b, accumulate)

    def _library(self, a, side: bool):
        """What runs a product whose operand is a: cuBLAS for float32, the stream's (or the
        side stream's) cuBLASLt for bf16; a stand-in blas (the simulator's) for both."""
        if not (is_bf16(a) and self._cublas):
            return self.side[1] if side else self.blas
        if not side:
            return self._fused_blas()
        if self._side_lt is None:
            self._side_lt = self._make_lt(self.side[0])
        return self._side_lt

    def matmul_residual(self, out, res, a, b) -> None:
        """out (M, N) = res (M, N) + a (M, K) @ b^T, b a weight (N, K); out may not overlap res.

        options.fused_residual (with a real cuBLAS): one cuBLASLt call, C = res, D = out (which
        refuses an overlap). Otherwise the product into a scratch buffer, then the residual
        kernel, which would allow one: the CPU backend refuses it too, so the CPU tests hold
        callers to the fused path's contract.
        """
        if self.options.fused_residual and self._cublas:
            self._fused_blas().gemm(out, a, b, trans_b=True, c=res)
            return
        tmp = self.scratch("matmul_residual", out.shape, out.dtype)
        self.matmul(tmp, a, b, trans_b=True)
        self.residual_forward(out, res, tmp)

    def _fused_blas(self):
        """The CublasLt on the stream, with its own workspace, made on first use: the first
        forward of a step runs eagerly (step_graph.py), so neither the workspace nor a
        product's heuristic query happens inside a captured graph (so is the side stream's)."""
        if self._lt is None:
            self._lt = self._make_lt(self.stream)
        return self._lt

    def _make_lt(self, stream) -> CublasLt:
        """A CublasLt on stream choosing algorithms as options.gemm_candidates says."""
        candidates = self.options.gemm_candidates
        return _on_stream(CublasLt, stream, self.blas.tf32, candidates=candidates,
                          timer=StreamTimer(self, stream))  # fmt: skip

    def matmul_batched(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """out (Z, M, N) = op(a[z]) @ op(b[z]) for each z (strided-batched GEMM)."""
        self.blas.gemm_strided_batched(out, a, b, trans_a, trans_b, accumulate)

    def matmul_pair(self, first, second) -> None:
        """Two independent products, each (out, a, b, trans_a, trans_b, accumulate): first
        on the stream, second deferred (matmul_deferred)."""
        self.matmul(*first)
        self.matmul_deferred(*second)

    def matmul_deferred(self, out, a, b, trans_a=False, trans_b=False, accumulate=False) -> None:
        """matmul, queued on the side stream after everything enqueued so far: it may run
        beside later launches until wait_deferred(), so until then a and b must not be
        written and out not read. Without a side stream, matmul."""
        scratch = self._transposed_operand(out, a, trans_a, trans_b)
        if self.side is None:
            blas = self._library(a, side=False)
            self._gemm(blas, self.stream, scratch, out, a, b, trans_a, trans_b, accumulate)
            return
        side, _, fork, done = self.side
        blas = self._library(a, side=True)  # made before the fork: it allocates a workspace
        if len(self._side_pending) == len(done) - 1:
            self.wait_deferred()  # the next event round the ring may still be waited for
        fork.record(self.stream)
        fork.wait(side)
        self._gemm(blas, side, scratch, out, a, b, trans_a, trans_b, accumulate)
        event = done[self._side_count % len(done)]
        event.record(side)
        self._side_pending.append(event)
        self._side_count += 1

    def _transposed_operand(self, out, a, trans_a, trans_b):
        """The scratch buffer (min(M, N), K) for a weight gradient's transposed operand
        (options.transpose_weight_grads), allocated here, before any fork; None: no transpose."""
        M, N = out.shape
        if not (self.options.transpose_weight_grads and trans_a and not trans_b):
            return None
        if is_bf16(a):  # bf16 products gain nothing from it (GpuOptions)
            return None
        if max(M, N) < self.options.transpose_min_width:
            return None
        return self.scratch("weight_grad_operand", (min(M, N), a.shape[0]), a.dtype)

    def _gemm(self, blas, stream, scratch, out, a, b, trans_a, trans_b, accumulate) -> None:
        """out = op(a) @ op(b) by blas on stream; with scratch, a^T b with the narrower
        operand transposed into it first (both on stream), so cuBLAS reads it K-contiguous."""
        if scratch is None:
            blas.gemm(out, a, b, trans_a, trans_b, accumulate)
        elif out.shape[1] <= out.shape[0]:  # b (K, N) is the narrower: b^T (N, K)
            self.k_transpose.transpose(scratch, b, stream)
            blas.gemm(out, a, scratch, trans_a=True, trans_b=True, accumulate=accumulate)
        else:  # a (K, M): a^T (M, K)
            self.k_transpose.transpose(scratch, a, stream)
            blas.gemm(out, scratch, b, accumulate=accumulate)

    def wait_deferred(self, keep: int = 0) -> None:
        """Later launches on the stream wait for the deferred products but the last `keep`
        (the side stream runs them in order, so waiting for one waits for all before it)."""
        if len(self._side_pending) > keep:
            self._side_pending[-1 - keep].wait(self.stream)
            self._side_pending = self._side_pending[len(self._side_pending) - keep :]

    # ------------------------------------------------------------ layers
    def embedding_forward(self, x, tokens, wte) -> None:
        self.k_embedding.embedding_forward(x, tokens, wte, self.stream, self.threads)

    def embedding_backward(self, dwte, dx, tokens, accumulate) -> None:
        self.k_embedding.embedding_backward(dwte, dx, tokens, accumulate, self.stream, self.threads)

    def rmsnorm_forward(self, y, rstd, x, w, eps) -> None:
        self.k_rmsnorm.rmsnorm_forward(y, rstd, x, w, eps, self.stream, self.threads)

    def rmsnorm_backward(self, dx, dw, dy, dres, x, w, rstd, accumulate) -> None:
        N, D = x.shape
        C = self.k_rmsnorm.partial_rows(N, self.rmsnorm_blocks)
        partial = self.scratch("rmsnorm_dw", (C, D), x.dtype)
        self.k_rmsnorm.rmsnorm_backward(
            dx, dw, dy, dres, x, w, rstd, accumulate, partial, self.stream, self.threads
        )

    def rope_forward(self, qkv, cos, sin, H, G, E, pos0=0) -> None:
        self.k_rope.rope_forward(qkv, cos, sin, H, G, E, pos0, self.stream, self.threads)

    def rope_backward(self, dqkv, cos, sin, H, G, E, pos0=0, out=None) -> None:
        self.k_rope.rope_backward(dqkv, cos, sin, H, G, E, pos0, self.stream, self.threads, out=out)

    def _tensor_cores(self, qkv, E: int) -> bool:
        """Whether attention on qkv runs on the tensor-core kernels: always for bf16 (no
        other kernel reads it), else with TF32 where the head size allows."""
        if is_bf16(qkv):
            from euler.gpu import attention_tc

            if not attention_tc.supports(E, bf16=True):
                raise EulerError(
                    f"bf16 attention: head size {E} is not one of "
                    f"{attention_tc.BF16_HEAD_SIZES}; use --precision tf32"
                )
            return True
        return self.k_attention_tc is not None and self.k_attention_tc.supports(E)

    def attention_forward(self, out, lse, qkv, H, G, E) -> None:
        if self._tensor_cores(qkv, E):
            from euler.gpu import attention_tc

            tc = self.options.tc_options(E, is_bf16(qkv))
            attention_tc.attention_forward(out, lse, qkv, H, G, E, self.stream, tc)
            return
        self.k_attention.attention_forward(out, lse, qkv, H, G, E, self.stream, self.tile)

    def attention_backward(self, dqkv, dout, qkv, out, lse, H, G, E) -> None:
        dsum = self.scratch("attention_dsum", lse.shape, lse.dtype)
        if self._tensor_cores(qkv, E):
            from euler.gpu import attention_tc

            tc = self.options.tc_options(E, is_bf16(qkv))
            B, T = qkv.shape[:2]
            flags = self.scratch("attention_flags", (attention_tc.flag_count(B, H, T),), np.int32)
            attention_tc.attention_backward(
                dqkv, dout, qkv, out, lse, H, G, E, dsum, self.stream, tc, flags=flags
            )
            return
        self.k_attention.attention_backward(
            dqkv, dout, qkv, out, lse, H, G, E, dsum, self.stream, self.tile
        )

    def swiglu_forward(self, h, gu) -> None:
        self.k_swiglu.swiglu_forward(h, gu, self.stream, self.threads)

    def swiglu_backward(self, dgu, dh, gu) -> None:
        self.k_swiglu.swiglu_backward(dgu, dh, gu, self.stream, self.threads)

    def residual_forward(self, out, a, b) -> None:
        self.k_residual.residual_forward(out, a, b, self.stream, self.threads)

    def cross_entropy_forward(self, losses, logits, targets) -> None:
        self.k_ce.cross_entropy_forward(losses, logits, targets, self.stream, self.threads)

    def cross_entropy_forward_backward(self, losses, logits, targets, scales, k) -> None:
        self.k_ce.cross_entropy_forward_backward(
            losses, logits, targets, scales, k, self.stream, self.threads
        )

    def loss_value(self, losses, head_scale):
        """sum_k head_scale[k] * sum(losses[k]) for losses (K, N), as a DeviceScalar (float64).

        head_scale is a staged (K,) array (stage_scalars). Nothing waits until float() is
        taken of the result.
        """
        out = self.scratch("loss", (1,), np.float64)
        self.k_ce.loss_sum(out, losses, head_scale, self.stream, self.threads)
        return self.memory.DeviceScalar(out, self.stream)

    # ------------------------------------------------------------ optimizer
    def _norm_stats(self, grads, max_norm: float):
        stats = self.scratch("grad_stats", (2,), np.float64)
        C = self.k_adamw.norm_blocks(grads.shape[0], self.threads, self.norm_blocks)
        partial = self.scratch("grad_partial", (C,), np.float64)
        self.k_adamw.grad_norm(stats, partial, grads, max_norm, self.stream, self.threads)
        return stats

    def grad_norm(self, grads) -> float:
        """Global L2 norm of the flat gradient (waits for the device)."""
        stats = self._norm_stats(grads, 0.0)
        return float(self.memory.DeviceScalar(stats[0:1], self.stream))

    def adamw_step(self, params, grads, m, v, hp, hyper, n_decay, lowp=None):
        """Clip by global norm, then AdamW in place; returns the norm before clipping.

        hyper: the staged (lr, 1 - beta1^step, 1 - beta2^step). The norm and the clip factor
        stay on the device: the result is a DeviceScalar. lowp (P,) bf16, if given, gets
        the new params rounded to bf16 by the same kernel.
        """
        stats = self._norm_stats(grads, hp.grad_clip)
        self.k_adamw.adamw_update(
            params, grads, m, v, stats, hyper, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
            n_decay, self.stream, self.threads, lowp=lowp,
        )  # fmt: skip
        return self.memory.DeviceScalar(stats[0:1], self.stream)

    # ------------------------------------------------------------ step graphs
    def capture(self, fn):
        """(CUDA graph of the work fn() enqueues, fn's result): see euler/gpu/graph.py."""
        from euler.gpu import graph

        self.capturing = True
        try:
            return graph.capture(self.stream, fn)
        finally:
            self.capturing = False

    # ------------------------------------------------------------ decoding with a KV cache
    def decode_linear(self, out, x, w) -> None:
        """out (n, M) = x (n, D) @ w (M, D)^T in float32, each element one warp's reduction
        in a fixed order, so a row's result does not depend on the rows beside it."""
        _float32("decode_linear", out=out, x=x, w=w)
        self.k_decode.linear_rows(out, x, w, self.stream)

    def decode_attention(self, out, qkv, k_cache, v_cache, slots, positions, H, G, E) -> None:
        """Write qkv (n, (H + 2G) E)'s keys and values into k_cache, v_cache (S, G, C, E) at
        (slots[r], positions[r]), then out (n, H E): row r attends to its slot's positions
        0..positions[r]. float32; slots and positions (n,) int32, their values checked by
        the caller (euler.inference.batch checks them on the host)."""
        _float32("decode_attention", out=out, qkv=qkv, k_cache=k_cache, v_cache=v_cache)
        if slots.dtype != np.int32 or positions.dtype != np.int32:
            raise ValueError("decode_attention: slots and positions must be int32")
        self.k_decode.attention_decode(out, qkv, k_cache, v_cache, slots, positions, H, G, E,
                                       self.stream)  # fmt: skip


def _float32(where: str, **arrays) -> None:
    """ValueError naming the first of arrays that is not float32 (decoding is float32)."""
    for name, a in arrays.items():
        if a.dtype != np.float32:
            raise ValueError(f"{where}: {name} is {a.dtype}; float32 expected")
