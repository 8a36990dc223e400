"""RoPE (euler/gpu/rope.py) on the `gpu` preset's qkv in several block shapes, timed.

    python bench/labs/rope_gpu.py [--T 512,2048] [--out rope.json]

A call rotates the q and k heads of qkv (B, T, (H + 2G) E) in place: B=32, H=12, G=4, E=64
reads and writes 67 MB each at T=512. Blocks of this lab's rope_vec_kernel (once the
package's, where a row's heads outgrow a block) are (E / 8, Y) threads, x over a head's
16-byte chunks of pairs and y over heads, one (b, t) row a block:
- "threads 256": Y = 256 / (E / 8) = 32, where the 16 rotated heads leave half the warps
  idle;
- "heads": Y = H + G, every thread busy;
- "heads x2": two rows a block, Y = 2 (H + G), the second half of y on the second row, no
  loops;
- "package": rope.rope_forward as the backend calls it (rope_rows_kernel, the winner:
  blocks (E / 8, H + G, 2), the row on z, no loops).
Each shape's result is checked against the package's before it is timed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import lengths_parser, timed  # noqa: E402
from euler.gpu import rope  # noqa: E402

H, G, E = 12, 4, 64  # the gpu preset's heads
HALF, HEADS, WIDTH = E // 2, H + G, (H + 2 * G) * E  # pairs a head, rotated heads, row


@cuda.jit
def rope_vec_kernel(qkv, cos, sin, C, Tn, half, n_qk_heads, pos0, sign):
    """rope_kernel on flat views qkv (B T C,), cos, sin (context E/2,), each thread rotating
    4 pairs per access (16-byte loads; E/2 % 4 == 0)."""
    E = 2 * half
    rows = qkv.shape[0] // C
    row = cuda.blockIdx.x
    while row < rows:
        t = row - row // Tn * Tn
        for i in range(4 * cuda.threadIdx.x, half, 4 * cuda.blockDim.x):
            for h in range(cuda.threadIdx.y, n_qk_heads, cuda.blockDim.y):
                rope.rotate4(qkv, row * C + h * E + i, half, cos, sin, (pos0 + t) * half + i, sign)
        row += cuda.gridDim.x


@cuda.jit
def rope_rows2_kernel(qkv, cos, sin, C, Tn, half, heads, pos0, sign):
    """rope_vec_kernel with two rows a block: threads y >= heads take row 2 blockIdx.x + 1."""
    E = 2 * half
    h = cuda.threadIdx.y
    row = 2 * cuda.blockIdx.x
    if h >= heads:
        h -= heads
        row += 1
    if row < qkv.shape[0] // C:
        t = row - row // Tn * Tn
        i = 4 * cuda.threadIdx.x
        rope.rotate4(qkv, row * C + h * E + i, half, cos, sin, (pos0 + t) * half + i, sign)


def calls(x, cos, sin, T: int, B: int, stream) -> dict:
    """Each block shape's call on x (B, T, WIDTH) in place, by name."""
    flat = (x.reshape(x.size), cos.reshape(cos.size), sin.reshape(sin.size))
    tail = (WIDTH, T, HALF, HEADS, 0, np.float32(1.0))
    vec, n = rope_vec_kernel, B * T
    return {
        "threads 256": lambda: vec[n, (HALF // 4, 32), stream](*flat, *tail),
        "heads": lambda: vec[n, (HALF // 4, HEADS), stream](*flat, *tail),
        "heads x2": lambda: rope_rows2_kernel[(n + 1) // 2, (HALF // 4, 2 * HEADS), stream](
            *flat, *tail
        ),
        "package": lambda: rope.rope_forward(x, cos, sin, H, G, E, 0, stream),
    }


def main() -> None:
    args = lengths_parser(__doc__).parse_args()
    stream = cuda.stream()
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        rng = np.random.default_rng(T)
        x_h = rng.standard_normal((args.batch, T, WIDTH)).astype(np.float32)
        ang = rng.uniform(0, 6.3, (T, HALF))
        cos, sin = (cuda.to_device(f(ang).astype(np.float32)) for f in (np.cos, np.sin))
        x = cuda.to_device(x_h)
        rope.rope_forward(x, cos, sin, H, G, E, 0, stream)
        want = x.copy_to_host()
        moved = 2 * args.batch * T * HEADS * E * 4  # bytes read and written
        for name, call in calls(x, cos, sin, T, args.batch, stream).items():
            x.copy_to_device(x_h, stream=stream)
            call()
            stream.synchronize()
            ok = bool(np.array_equal(x.copy_to_host(), want))
            ms = timed(stream, call, args.reps)
            rows.append({"shape": name, "B": args.batch, "T": T, "ms": ms, "ok": ok,
                         "TB/s": moved / ms / 1e9})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
