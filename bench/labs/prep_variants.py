"""The attention backward's prep (D = rowsum(dO O), dQ zeroed) in several schedules, timed.

    python bench/labs/prep_variants.py [--T 512,2048] [--out prep.json]

The prep moves 151 MB at T=512 (B=32, H=12, E=64: dO and O read, dQ's columns of dqkv
written); the tensor-core backward runs it where T is not a multiple of 64. The variants
here index by a grid (T / R, B) of blocks of H E / 4 threads: thread k takes columns
4k..4k+3 of R rows (its head is k // (E / 4), a shift), all 2R loads issued before the
first sum. For scale: dQ's zeros alone by the driver's 2-d memset, and the reads alone (no
zeros). "package" is attention.backward_prep as it is now (rows1's schedule).

Each variant's dsum and dqkv are checked against the package kernel's before it is timed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import lengths_parser, timed  # noqa: E402
from euler.gpu import attention  # noqa: E402
from euler.gpu.reduce import MAX_THREADS, group_sum  # noqa: E402
from euler.gpu.vector import load4_3d, store4_3d  # noqa: E402


@cuda.jit
def prep_r1(dqkv, dsum, dout, out, shift, reads_only):
    """Grid (T, B), H E / 4 threads: one row a thread."""
    T = out.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    k = cuda.threadIdx.x
    b, i, c, L = cuda.blockIdx.y, cuda.blockIdx.x, 4 * k, 1 << shift
    o0, o1, o2, o3 = load4_3d(out, b, i, c)
    d0, d1, d2, d3 = load4_3d(dout, b, i, c)
    if not reads_only:
        store4_3d(dqkv, b, i, c, T(0.0), T(0.0), T(0.0), T(0.0))
    s = group_sum(d0 * o0 + d1 * o1 + d2 * o2 + d3 * o3, buf, T(0.0), L)
    if k & (L - 1) == 0:
        dsum[b, k >> shift, i] = s


@cuda.jit
def prep_r2(dqkv, dsum, dout, out, shift, reads_only):
    """Grid (T / 2, B), H E / 4 threads: rows 2x and 2x + 1, all four loads first."""
    T = out.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    Tn = out.shape[1]
    k = cuda.threadIdx.x
    b, c, L = cuda.blockIdx.y, 4 * k, 1 << shift
    i0 = 2 * cuda.blockIdx.x
    i1 = min(i0 + 1, Tn - 1)  # an odd T's last block reads its row twice
    a0, a1, a2, a3 = load4_3d(out, b, i0, c)
    x0, x1, x2, x3 = load4_3d(dout, b, i0, c)
    e0, e1, e2, e3 = load4_3d(out, b, i1, c)
    y0, y1, y2, y3 = load4_3d(dout, b, i1, c)
    if not reads_only:
        z = T(0.0)
        store4_3d(dqkv, b, i0, c, z, z, z, z)
        store4_3d(dqkv, b, i1, c, z, z, z, z)
    s0 = group_sum(x0 * a0 + x1 * a1 + x2 * a2 + x3 * a3, buf, T(0.0), L)
    s1 = group_sum(y0 * e0 + y1 * e1 + y2 * e2 + y3 * e3, buf, T(0.0), L)
    if k & (L - 1) == 0:
        dsum[b, k >> shift, i0] = s0
        dsum[b, k >> shift, i1] = s1


@cuda.jit
def prep_r4(dqkv, dsum, dout, out, shift, reads_only):
    """Grid (T / 4, B), H E / 4 threads: rows 4x..4x + 3, all eight loads first."""
    T = out.dtype.type
    buf = cuda.shared.array(MAX_THREADS, float32)
    Tn = out.shape[1]
    k = cuda.threadIdx.x
    b, c, L = cuda.blockIdx.y, 4 * k, 1 << shift
    i0 = 4 * cuda.blockIdx.x
    i1, i2, i3 = min(i0 + 1, Tn - 1), min(i0 + 2, Tn - 1), min(i0 + 3, Tn - 1)
    a0, a1, a2, a3 = load4_3d(out, b, i0, c)
    x0, x1, x2, x3 = load4_3d(dout, b, i0, c)
    e0, e1, e2, e3 = load4_3d(out, b, i1, c)
    y0, y1, y2, y3 = load4_3d(dout, b, i1, c)
    f0, f1, f2, f3 = load4_3d(out, b, i2, c)
    u0, u1, u2, u3 = load4_3d(dout, b, i2, c)
    g0, g1, g2, g3 = load4_3d(out, b, i3, c)
    v0, v1, v2, v3 = load4_3d(dout, b, i3, c)
    if not reads_only:
        z = T(0.0)
        for i in (i0, i1, i2, i3):
            store4_3d(dqkv, b, i, c, z, z, z, z)
    s0 = group_sum(x0 * a0 + x1 * a1 + x2 * a2 + x3 * a3, buf, T(0.0), L)
    s1 = group_sum(y0 * e0 + y1 * e1 + y2 * e2 + y3 * e3, buf, T(0.0), L)
    s2 = group_sum(u0 * f0 + u1 * f1 + u2 * f2 + u3 * f3, buf, T(0.0), L)
    s3 = group_sum(v0 * g0 + v1 * g1 + v2 * g2 + v3 * g3, buf, T(0.0), L)
    if k & (L - 1) == 0:
        h = k >> shift
        dsum[b, h, i0] = s0
        dsum[b, h, i1] = s1
        dsum[b, h, i2] = s2
        dsum[b, h, i3] = s3


ROWS = {1: prep_r1, 2: prep_r2, 4: prep_r4}


def variant_calls(stream, dqkv, dsum, dout, out, H: int, E: int) -> dict:
    """name -> a zero-argument call of each variant on these arrays."""
    B, T, HE = out.shape
    shift = (E // 4).bit_length() - 1
    calls = {"package": lambda: attention.backward_prep(dqkv, dsum, dout, out, H, E, stream)}
    for r, kern in ROWS.items():
        grid = ((T + r - 1) // r, B)
        for reads_only in (False, True):
            name = f"rows{r}" + (" reads only" if reads_only else "")
            calls[name] = lambda k=kern, g=grid, ro=reads_only: k[g, HE // 4, stream](
                dqkv, dsum, dout, out, shift, ro
            )
    calls["memset2d zeros only"] = lambda: _memset_q(dqkv, HE, stream)
    return calls


def _memset_q(dqkv, HE: int, stream) -> None:
    """dQ's columns of dqkv zeroed by the driver (cuMemsetD2D32Async)."""
    from numba.cuda.cudadrv.driver import driver

    B, T, C = dqkv.shape
    ptr = dqkv.__cuda_array_interface__["data"][0]
    driver.cuMemsetD2D32Async(ptr, C * 4, 0, HE, B * T, stream.handle)


def main() -> None:
    args = lengths_parser(__doc__).parse_args()
    stream = cuda.stream()
    H, G, E, B = 12, 4, 64, args.batch
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        rng = np.random.default_rng(0)
        C = (H + 2 * G) * E
        dout_h = rng.standard_normal((B, T, H * E)).astype(np.float32)
        out_h = rng.standard_normal((B, T, H * E)).astype(np.float32)
        dout, out = cuda.to_device(dout_h, stream), cuda.to_device(out_h, stream)
        dqkv = cuda.to_device(np.ones((B, T, C), np.float32), stream)
        dsum = cuda.device_array((B, H, T), np.float32, stream=stream)
        want = (dout_h * out_h).reshape(B, T, H, E).sum(-1).transpose(0, 2, 1)
        nbytes = 3 * dout_h.nbytes
        for name, call in variant_calls(stream, dqkv, dsum, dout, out, H, E).items():
            dqkv.copy_to_device(np.ones((B, T, C), np.float32), stream)
            dsum.copy_to_device(np.zeros((B, H, T), np.float32), stream)
            try:
                call()
                stream.synchronize()
            except Exception as exc:  # a driver call missing from this binding, say
                print(json.dumps({"variant": name, "T": T, "error": str(exc)[:200]}), flush=True)
                continue
            got_q = dqkv.copy_to_host()[..., : H * E]
            err = float(np.abs(dsum.copy_to_host() - want).max())
            zeros = "zeros" in name or "reads only" not in name
            ok = (err < 1e-3 or "zeros only" in name) and (not zeros or not got_q.any())
            ms = timed(stream, call, args.reps)
            moved = nbytes / 3 * ((2 if "zeros only" not in name else 0) + (zeros and 1))
            rows.append(
                {
                    "variant": name,
                    "B": B,
                    "T": T,
                    "ms": ms,
                    "TB/s": moved / ms / 1e9,
                    "dsum max err": err,
                    "checked": bool(ok),
                }  # fmt: skip
            )
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
