"""The weight gradients' transpose (euler/gpu/transpose.py) on a GPU: ms and TB/s, launch-free.

    python bench/labs/transpose_gpu.py [--module PATH] [--out transpose.json]

Times transpose(dst, src) at the `gpu` preset's token-major operands, src (16384, W) for W
in 768, 1280, 2048 and 4096 (bench/gpu_timing.timed: 10 calls back to back), and checks
each result against NumPy. --module loads `transpose` from another file instead (an older
version, say: `git show REV:euler/gpu/transpose.py > old.py`), for an A/B in one process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import timed  # noqa: E402
from euler.gpu import transpose as package_transpose  # noqa: E402

ROWS, WIDTHS = 16384, (768, 1280, 2048, 4096)


def load(path: Path | None):
    """The transpose function of the module at path (the package's if None)."""
    if path is None:
        return package_transpose.transpose
    spec = importlib.util.spec_from_file_location("transpose_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.transpose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    transpose = load(args.module)
    stream, rows = cuda.stream(), []
    for W in WIDTHS:
        host = np.random.default_rng(W).standard_normal((ROWS, W)).astype(np.float32)
        src = cuda.to_device(host, stream=stream)
        dst = cuda.device_array((W, ROWS), np.float32, stream=stream)
        transpose(dst, src, stream)
        assert np.array_equal(dst.copy_to_host(stream=stream), host.T), W
        ms = timed(stream, lambda dst=dst, src=src: transpose(dst, src, stream), args.reps)
        rec = {"rows": ROWS, "width": W, "module": str(args.module or "package"), "ms": ms,
               "tb_per_s": 2 * host.nbytes / ms / 1e9}  # fmt: skip
        rows.append(rec)
        print(json.dumps(rec), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
