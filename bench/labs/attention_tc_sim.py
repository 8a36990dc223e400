"""Errors of the tensor-core attention in TF32 and in 3xTF32, in the CUDA simulator.

    python bench/labs/attention_tc_sim.py

The simulator emulates mma.sync (euler/gpu/mma.py), so no GPU is needed. For one small
causal case (B=1, T=19, H=2, G=1, E=8) it prints the largest error of out, lse and dqkv
against the float64 reference, relative to each output's largest value, with SPLIT_TF32
off and on. attention_tc.py and bench/notes_gpu.md quote it; about two minutes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from euler.gpu import attention_tc  # noqa: E402
from tests.numpy_reference import attention_with_grads  # noqa: E402


def main() -> None:
    B, T, H, G, E = 1, 19, 2, 1, 8
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
    dout = rng.standard_normal((B, T, H * E)).astype(np.float32)
    ref = attention_with_grads(qkv, dout, H, G, E)
    for split in (False, True):
        attention_tc.SPLIT_TF32 = split
        out = np.full((B, T, H * E), np.nan, np.float32)
        lse = np.full((B, H, T), np.nan, np.float32)
        attention_tc.attention_forward(out, lse, qkv, H, G, E)
        dqkv = np.full_like(qkv, np.nan)
        dsum = np.full((B, H, T), np.nan, np.float32)
        attention_tc.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum)
        got = (out, lse, dqkv)
        errs = [np.abs(g - w).max() / np.abs(w).max() for g, w in zip(got, ref, strict=True)]
        name = "3xTF32" if split else "TF32"
        print(f"{name:6s} relative max error: out {errs[0]:.1e}, lse {errs[1]:.1e}, "
              f"dqkv {errs[2]:.1e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
