"""The CPU step's matrix products under each ProductPlan variant, and under threaded OpenBLAS.

    NUMBA_NUM_THREADS=16 taskset -c 0-15 python bench/labs/cpu_products.py --preset small

For every product of a training step at (B, T) (the forward's, each backward pair of dX and
dW run as one call, as the model runs them) it times the variants of euler.cpu.blas's
ProductPlan at this process's thread count, and OpenBLAS's own threads on each product
whole (NumPy's matmul, one product after the other), and prints the milliseconds a step's
products take under each: the package keeps the fastest plan that fixes the bits by shapes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from typing import Annotated

import numba
import numpy as np
import typer

from euler.backend import Product
from euler.cpu import blas
from euler.model.config import get_preset

VARIANTS = {
    "default": blas.default_plan(),
    "static": replace(blas.default_plan(), dynamic=False),
    "1 block a thread": replace(blas.default_plan(), per_thread=1, many_threads=1 << 20),
    "2 blocks a thread": replace(blas.default_plan(), many_threads=1 << 20),
    "4 blocks a thread": replace(blas.default_plan(), per_thread=4, many_threads=1 << 20),
    "block_macs 4M": replace(blas.default_plan(), block_macs=1 << 22),
    "pieces 2": replace(blas.default_plan(), pieces=2),
    "pieces 8": replace(blas.default_plan(), pieces=8),
}


def step_products(cfg, B: int, T: int, rng) -> list[tuple[str, int, list[Product]]]:
    """(name, calls a step, products) for each product call of a training step, each
    product on random float32 arrays."""
    N, D, F, V = B * T, cfg.d_model, cfg.ffn_hidden, cfg.vocab_size
    Q, QKV = cfg.q_dim, cfg.qkv_dim

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def fwd(n_out, n_in):  # (N, n_out) = x (N, n_in) @ W^T
        return [Product(r(N, n_out), r(N, n_in), r(n_out, n_in), trans_b=True)]

    def pair(n_out, n_in):  # dX (N, n_in) = dY (N, n_out) @ W; dW (n_out, n_in) = dY^T X
        dy = r(N, n_out)
        return [Product(r(N, n_in), dy, r(n_out, n_in)),
                Product(r(n_out, n_in), dy, r(N, n_in), trans_a=True)]  # fmt: skip

    L, K = cfg.n_layer, cfg.n_mtp
    return [
        ("fwd qkv", L, fwd(QKV, D)), ("fwd wo", L, fwd(D, Q)),
        ("fwd gateup", L, fwd(2 * F, D)), ("fwd down", L, fwd(D, F)),
        ("fwd head", K, fwd(V, D)), ("bwd head", K, pair(V, D)),
        ("bwd down", L, pair(D, F)), ("bwd gateup", L, pair(2 * F, D)),
        ("bwd wo", L, pair(D, Q)), ("bwd qkv", L, pair(QKV, D)),
    ]  # fmt: skip


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps calls, after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def report(variant: str, threads: int, ms: dict, plan: dict | None) -> None:
    """One JSON line: a variant's ms a step, in all and by product."""
    total = round(sum(ms.values()), 3)
    by_product = {k: round(v, 3) for k, v in ms.items()}
    print(json.dumps({"variant": variant, "threads": threads, "ms_step": total,
                      "ms": by_product, "plan": plan}))  # fmt: skip


def main(
    preset: Annotated[str, typer.Option()] = "small",
    batch: Annotated[int, typer.Option("--batch-size")] = 16,
    seq: Annotated[int, typer.Option("--seq-len")] = 128,
    reps: Annotated[int, typer.Option()] = 20,
) -> None:
    """Print the ms a step's products take under each variant (one JSON line each)."""
    cfg = get_preset(preset)
    calls = step_products(cfg, batch, seq, np.random.default_rng(0))
    threads = numba.get_num_threads()
    for name, plan in VARIANTS.items():
        mm = blas.Products(plan)

        def run(products, mm=mm):
            mm(*products[0]) if len(products) == 1 else mm.pair(*products)

        ms = {n: 1e3 * c * timed(lambda p=p: run(p), reps) for n, c, p in calls}
        report(name, threads, ms, asdict(plan))
    blas.set_blas_threads(threads)
    try:

        def whole(products):
            for out, a, b, ta, tb, _ in products:
                np.matmul(a.T if ta else a, b.T if tb else b, out=out)

        ms = {n: 1e3 * c * timed(lambda p=p: whole(p), reps) for n, c, p in calls}
        report(f"OpenBLAS threads ({threads})", threads, ms, None)
    finally:
        blas.set_blas_threads(1)


if __name__ == "__main__":
    typer.run(main)
