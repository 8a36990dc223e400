"""RMSNorm forward and backward on a GPU at the `gpu` preset's rows: ms and TB/s, launch-free.

    python bench/labs/rmsnorm_gpu.py [--blocks 132,264,528,792,1056] [--out rmsnorm.json]

x, dy, dres (16384, 768) float32 (B = 32, T = 512, D = 768), timed by bench/gpu_timing.timed
(10 calls back to back): the forward (reads x, writes y: 2 N D floats) and the backward
(reads dy, x, dres, writes dx: 4 N D floats, plus the dw partials) at each count of backward
blocks (GpuBackend.rmsnorm_blocks; the package's: rmsnorm.PARTIAL_BLOCKS_PER_SM a
multiprocessor). The bytes are the minimum a call moves, so TB/s is against the H200's ~4 TB/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402

N, D = 16384, 768


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="132,264,528,792,1056")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from euler.gpu.backend import GpuBackend

    be = GpuBackend(tf32=True)
    rng = np.random.default_rng(0)
    x, dy, w = (be.to_device(rng.standard_normal(s).astype(np.float32)) for s in (N * D, N * D, D))
    x, dy = x.reshape(N, D), dy.reshape(N, D)
    y, dx, dw = be.zeros((N, D), np.float32), be.zeros((N, D), np.float32), be.zeros(D, np.float32)
    rstd = be.zeros(N, np.float32)
    rows, nbytes = [], 4 * N * D

    def record(**rec) -> None:
        rec["tb_per_s"] = rec.pop("bytes") / rec["ms"] / 1e9
        rows.append(rec)
        print(json.dumps(rec), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))

    forward = lambda: be.rmsnorm_forward(y, rstd, x, w, 1e-5)  # noqa: E731
    forward()
    record(part="forward", blocks=None, ms=timed(be.stream, forward, args.reps), bytes=2 * nbytes)
    for blocks in (int(b) for b in args.blocks.split(",")):
        be.rmsnorm_blocks = blocks
        backward = lambda: be.rmsnorm_backward(dx, dw, dy, y, x, w, rstd, False)  # noqa: E731
        backward()
        ms = timed(be.stream, backward, args.reps)
        record(part="backward", blocks=blocks, ms=ms, bytes=4 * nbytes)


if __name__ == "__main__":
    main()
