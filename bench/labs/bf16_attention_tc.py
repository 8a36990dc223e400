"""The bf16 tensor-core attention beside the TF32 one on a GPU: resources and times.

Compiles both precisions' forward and dkv kernels at the `gpu` preset's heads (E = 64,
H = 12, G = 4), prints each kernel's registers a thread, static and dynamic shared memory
and local memory (a spill shows there), then times forward and backward (prep blocks
included) at B x T = 32 x 512 with CUDA events, the median of 20 calls after 3 warm-ups,
and the bf16 outputs' largest error at B = 2 against float64 attention of the same bf16
inputs, as a fraction of the largest reference value (tests/test_gpu_tc.py allows 2^-6).

    python bench/labs/bf16_attention_tc.py [--skip-tf32]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from numba import cuda

from euler.gpu import attention_tc
from euler.precision import to_bf16

H, G, E = 12, 4, 64


def _time(fn, reps: int = 20) -> float:
    """Median milliseconds of fn() over reps calls, after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return float(np.median(times))


def _resources(options: attention_tc.TcOptions) -> None:
    """Registers, shared and local memory of each compiled kernel of options."""
    sizes = attention_tc.shared_bytes(options)
    for name, k in zip(("forward", "dkv"), attention_tc.kernels(options), strict=True):
        kernel = next(iter(k.overloads.values()))
        print(
            f"  {name}: {kernel.regs_per_thread} registers, "
            f"{kernel.local_mem_per_thread} B local, dynamic shared {sizes[name]} B"
        )


def _accuracy(T: int) -> None:
    """The bf16 kernels' largest errors at B = 2 against float64 of their bf16 inputs."""
    from euler.precision import from_bf16
    from tests.numpy_reference import attention_with_grads

    rng = np.random.default_rng(1)
    qkv = to_bf16(rng.standard_normal((2, T, (H + 2 * G) * E)))
    dout = to_bf16(rng.standard_normal((2, T, H * E)))
    ref = attention_with_grads(from_bf16(qkv), from_bf16(dout), H, G, E)
    d_qkv, d_dout = cuda.to_device(qkv), cuda.to_device(dout)
    out = cuda.device_array((2, T, H * E), np.uint16)
    lse, dsum = (cuda.device_array((2, H, T), np.float32) for _ in range(2))
    dqkv = cuda.device_array(qkv.shape, np.float32)
    attention_tc.attention_forward(out, lse, d_qkv, H, G, E)
    attention_tc.attention_backward(dqkv, d_dout, d_qkv, out, lse, H, G, E, dsum)
    got = (from_bf16(out.copy_to_host()), lse.copy_to_host(), dqkv.copy_to_host())
    errors = [np.abs(g - w).max() / np.abs(w).max() for g, w in zip(got, ref, strict=True)]
    print("bf16 vs float64, largest error / largest value: out {:.2e}, lse {:.2e}, "
          "dqkv {:.2e}".format(*errors))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tf32", action="store_true")
    parser.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    parser.add_argument("--seq-len", dest="seq", metavar="T", type=int, default=512)
    args = parser.parse_args()
    B, T = args.batch, args.seq
    rng = np.random.default_rng(0)
    qkv32 = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
    dout32 = rng.standard_normal((B, T, H * E)).astype(np.float32)
    flops = 4 * B * H * T * T * E / 2  # causal: half of S and of O's products
    for bf16 in (True, False) if not args.skip_tf32 else (True,):
        store = np.uint16 if bf16 else np.float32
        qkv = cuda.to_device(to_bf16(qkv32) if bf16 else qkv32)
        dout = cuda.to_device(to_bf16(dout32) if bf16 else dout32)
        out = cuda.device_array((B, T, H * E), store)
        lse, dsum = (cuda.device_array((B, H, T), np.float32) for _ in range(2))
        dqkv = cuda.device_array(qkv.shape, np.float32)

        def fwd(qkv=qkv, out=out, lse=lse):
            attention_tc.attention_forward(out, lse, qkv, H, G, E)

        def bwd(qkv=qkv, out=out, lse=lse, dout=dout, dqkv=dqkv, dsum=dsum):
            attention_tc.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum)

        tf, tb = _time(fwd), _time(bwd)
        name = "bf16" if bf16 else "tf32"
        print(f"{name} (B={B}, T={T}, H={H}, G={G}, E={E}, scale {1 / math.sqrt(E):.3f}):")
        _resources(attention_tc.TcOptions(E, bf16=bf16))
        print(f"  forward {tf:.3f} ms ({flops / tf / 1e9:.0f} TFLOP/s)")
        print(f"  backward {tb:.3f} ms ({2.5 * flops / tb / 1e9:.0f} TFLOP/s)")
    _accuracy(T)


if __name__ == "__main__":
    main()
