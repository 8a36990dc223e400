"""Numba compile time of one whole CPU training step, cold (empty cache) and warm (cached).

    python bench/compile_time.py

Each measurement runs in a fresh interpreter with NUMBA_CACHE_DIR pointed at one temporary
folder: the first run compiles every kernel and writes the cache, the second loads it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STEP = """
import time, numpy as np
t0 = time.perf_counter()
from euler.model.config import get_preset
from euler.model.transformer import Model, make_targets
from euler.training.optim import AdamW
cfg = get_preset("small")
m = Model(cfg)
w = np.random.default_rng(0).integers(0, cfg.vocab_size, (16, 128 + cfg.n_mtp))
t1 = time.perf_counter()
m.forward(w[:, :128], make_targets(w, 128, cfg.n_mtp), need_grad=True)
m.backward()
AdamW(m).step(1e-3)
print(time.perf_counter() - t1)
"""


def first_step_seconds(cache_dir: str) -> float:
    """Seconds of the first forward + backward + AdamW in a fresh process."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", STEP], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cold = first_step_seconds(cache)
        warm = first_step_seconds(cache)
    print(json.dumps({"cold_s": round(cold, 2), "warm_s": round(warm, 2)}))


if __name__ == "__main__":
    main()
