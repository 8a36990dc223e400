"""Where the tensor-core attention's time goes: a least-squares fit over sequence lengths.

    python bench/labs/attention_lengths_fit.py \
        FILE

reads the tensor-core "time" records of `python bench/attention_tc_gpu.py --T
128,256,512,1024,2048 --out FILE` and fits
- forward time = a x key tiles + f x blocks: the forward's blocks are (64 query rows, b, h),
  n = T / 64 of them a head and N = n (n + 1) / 2 tiles;
- backward time = a x (key tile, query tile, head) pairs + c x T: the dkv blocks (B G n)
  and the prep kernel (B T H rows) both grow with T, so one term takes both.
It prints the coefficients (us, summed over the GPU), each fit's prediction and each
term's share of the time at every T.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def fit(terms: dict[str, np.ndarray], ms: np.ndarray) -> dict:
    """Least squares of ms (as us) on the named columns: coefficients, prediction, shares."""
    A = np.stack(list(terms.values()), axis=1).astype(float)
    coef = np.linalg.lstsq(A, ms * 1000.0, rcond=None)[0]
    pred = A @ coef
    return {
        "us_per": dict(zip(terms, coef.tolist(), strict=True)),
        "predicted_us": pred.tolist(),
        "measured_us": (ms * 1000.0).tolist(),
        "share": {k: (A[:, i] * coef[i] / pred).tolist() for i, k in enumerate(terms)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    args = ap.parse_args()
    records = json.loads(args.results.read_text())
    recs = [r for r in records if r.get("kind") == "time" and r.get("impl", "tc") == "tc"]
    recs.sort(key=lambda r: r["T"])
    T = np.array([r["T"] for r in recs])
    B, H, G = recs[0]["B"], recs[0]["H"], recs[0]["G"]
    n = (T + 63) // 64
    heads = B * H
    fwd = fit({"tile": heads * n * (n + 1) // 2, "block": heads * n},
              np.array([r["fwd_ms"] for r in recs]))  # fmt: skip
    bwd = fit({"pair": heads * n * (n + 1) // 2, "token": B * T},
              np.array([r["bwd_ms"] for r in recs]))  # fmt: skip
    print(json.dumps({"T": T.tolist(), "B": B, "H": H, "G": G, "forward": fwd, "backward": bwd},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
