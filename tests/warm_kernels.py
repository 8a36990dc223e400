"""Compile the CPU engine's kernels into Numba's disk cache while the session's first tests run.

    python tests/warm_kernels.py

conftest.py starts this as collection ends, beside the session on the other core: most of
a cold run's minutes are Numba compiling, one kernel at a time on one core, and the
session reaches the float64, FlashAttention and dense-attention kernels only minutes in. A
kernel this has compiled by then, the session loads from the cache; one the session
reaches first, both compile, as one would alone. Nothing here is checked: the tests check
the kernels.
"""

from __future__ import annotations

import numpy as np

from euler.bench.steps import synthetic_batch
from euler.cpu.backend import CpuBackend
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.optim import AdamW


def main() -> None:
    """One training step of the tiny preset in each dtype, with dense attention and with
    FlashAttention (a tile asks for it)."""
    cfg = get_preset("tiny")
    tokens, targets = synthetic_batch(cfg, 2, 16)
    for dtype in (np.float64, np.float32):
        for tile in (16, None):
            model = Model(cfg, backend=CpuBackend(attention_tile=tile), dtype=dtype, seed=0)
            model.forward(tokens, targets, need_grad=True)
            model.backward()
            AdamW(model).step(1e-3)


if __name__ == "__main__":
    main()
