"""KV-cache attention for decoding: the package's split-keys kernel against one key at a time.

    python bench/labs/decode_attention_gpu.py [--rows 1,8,32] [--keys 32,128,512]
        [--reps 5] [--out decode-attention.json]
    NUMBA_ENABLE_CUDASIM=1 python bench/labs/decode_attention_gpu.py --rows 1 --keys 200 \
        --check-only

The package (euler.gpu.decode.attention_decode_kernel) gives a (row, head) a block of
WARPS warps: each warp takes every WARPS-th run of 32 keys, a lane scoring one key, and
the warps' online softmaxes are merged at the end. The variant here (`one key`) is the
kernel it replaced: one warp a (row, head), the keys one after another, each scored by a
warp reduction, so a step at batch 1 keeps 12 warps of the H200's 132 multiprocessors
busy for a chain of as many reductions as there are keys.

Both are timed launch-free (bench/gpu_timing.timed) on the `gpu` preset's heads (H = 12,
G = 4, E = 64) with every row at position keys - 1 of its own slot, and checked against
each other (they sum in different orders: 1e-5).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import decode  # noqa: E402
from euler.gpu.decode import MAX_E, PER_LANE  # noqa: E402
from euler.gpu.reduce import MAX_THREADS, WARP, warp_sum_all  # noqa: E402
from euler.layer_math import exp_, online_softmax_rescale  # noqa: E402

H, G, E = 12, 4, 64


@cuda.jit
def one_key_kernel(out, qkv, k_cache, v_cache, slots, positions, H, G, E, scale):
    """out (n, H E), assigned: block (r, h), one warp, attends row r's query head h to its
    slot's keys 0..positions[r] one at a time (online softmax); lane l holds the elements
    e = l, l + 32, ... of the query and the running output."""
    buf = cuda.shared.array(MAX_THREADS, float32)
    qv = cuda.local.array(PER_LANE, float32)
    acc = cuda.local.array(PER_LANE, float32)
    lane = cuda.threadIdx.x
    r = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - r * H
    g = h // (H // G)
    s = slots[r]
    per = (E + WARP - 1) // WARP
    for k in range(per):
        e = lane + k * WARP
        qv[k] = qkv[r, h * E + e] * scale if e < E else float32(0.0)
        acc[k] = float32(0.0)
    m = float32(-math.inf)
    total = float32(0.0)
    for j in range(positions[r] + 1):
        d = float32(0.0)
        for k in range(per):
            e = lane + k * WARP
            if e < E:
                d += qv[k] * k_cache[s, g, j, e]
        d = warp_sum_all(d, buf, float32(0.0))
        m_new = max(m, d)
        alpha = online_softmax_rescale(m, m_new, float32)
        p = exp_(d - m_new)
        total = total * alpha + p
        for k in range(per):
            e = lane + k * WARP
            if e < E:
                acc[k] = acc[k] * alpha + p * v_cache[s, g, j, e]
        m = m_new
    inv = float32(1.0) / total
    for k in range(per):
        e = lane + k * WARP
        if e < E:
            out[r, h * E + e] = acc[k] * inv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--keys", default="32,128,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--check-only", action="store_true", help="compare, do not time")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    assert E <= MAX_E
    stream, rows = cuda.stream(), []
    rng = np.random.default_rng(0)
    scale = np.float32(1.0 / math.sqrt(E))
    for n in map(int, args.rows.split(",")):
        for keys in map(int, args.keys.split(",")):
            qkv = cuda.to_device(rng.standard_normal((n, (H + 2 * G) * E)).astype(np.float32))
            k_cache, v_cache = (
                cuda.to_device(rng.standard_normal((n, G, keys, E)).astype(np.float32))
                for _ in range(2)
            )
            slots = cuda.to_device(np.arange(n, dtype=np.int32))
            positions = cuda.to_device(np.full(n, keys - 1, np.int32))
            out_pkg, out_one = (cuda.to_device(np.zeros((n, H * E), np.float32)) for _ in range(2))
            args_ = (qkv, k_cache, v_cache, slots, positions, H, G, E, scale)

            def package(out=out_pkg, a=args_, grid=n * H):
                decode.attention_decode_kernel[grid, decode.KEYS, stream](out, *a)

            def one_key(out=out_one, a=args_, grid=n * H):
                one_key_kernel[grid, WARP, stream](out, *a)

            package()
            one_key()
            stream.synchronize()
            np.testing.assert_allclose(out_pkg.copy_to_host(), out_one.copy_to_host(),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
            for name, call in (("split keys (package)", package), ("one key", one_key)):
                ms = None if args.check_only else timed(stream, call, args.reps)
                rec = {"variant": name, "rows": n, "keys": keys, "H": H, "G": G, "E": E,
                       "us": ms and ms * 1e3}  # fmt: skip
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
