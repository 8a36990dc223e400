"""Product plans side by side: one engine a plan in one process, timed in alternating rounds.

    NUMBA_NUM_THREADS=16 taskset -c 0-15 python bench/labs/cpu_plans.py \
        --plans default,many_threads=1048576,fixed16 --rounds 8 --steps 10

A step's time swings by a third on a shared machine (other tenants take a core, and every
parallel loop waits for its last thread), so plans timed one after the other, or in separate
processes, are compared through that noise. Here every plan has its own engine in one
process, warmed the same, and the rounds take the plans in turn: each round times `steps`
steps of each plan and keeps their median; a plan's figure is the median of its rounds.

Plans (euler/cpu/blas.py's ProductPlan and two lab variants):
- default: default_plan(), the plan the package runs (by the kernel family of OpenBLAS);
- FIELD=VALUE[+FIELD=VALUE...]: ProductPlan with those fields replaced (per_thread=1: one
  block a thread; per_thread=1+pair_per_thread=2: one a thread for a product alone, two
  for each of a backward's pair; many_threads=1048576: two blocks a thread at every count;
  per_thread=4+many_threads=1048576: four at every count; block_macs=4194304, ...);
- fixedN: N row x column blocks whatever the thread count (where the product is large
  enough), as the package did before its cut followed the thread count;
- pair_split=S (a lab field, with any of the above fields): each product of a backward's
  pair cut as for threads / S threads, since the two share the threads (pair_split=2 at 2
  threads: dX whole on one thread while the other takes dW's sum pieces).

A plan that cuts only rows and columns differently must give the default's bits (64-aligned
cuts keep them); one that cuts sums differently (pieces, piece_min, small_output) adds in
another order and may not. The lab prints each plan's last loss, after as many steps each,
and whether they are all equal. One JSON line a run.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Annotated

import numba
import typer

from euler.bench.steps import synthetic_batch
from euler.cpu.backend import CpuBackend
from euler.cpu.blas import ProductPlan, default_plan
from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training.optim import AdamW


@dataclasses.dataclass(frozen=True)
class FixedPlan(ProductPlan):
    """The cut of `blocks` row x column blocks at any thread count above one."""

    blocks: int = 16
    many_threads: int = 1 << 20  # per_thread blocks a thread at every count

    def cut(
        self, M: int, N: int, K: int, trans_a: bool, threads: int, paired: bool = False
    ) -> tuple[int, int, int]:
        """ProductPlan's cut as if `blocks / per_thread` threads ran it."""
        return super().cut(
            M, N, K, trans_a, max(1, self.blocks // self.per_thread) if threads > 1 else 1, paired
        )


@dataclasses.dataclass(frozen=True)
class SplitPairPlan(ProductPlan):
    """ProductPlan whose pairs cut each product as for threads // pair_split threads."""

    pair_split: int = 1

    def cut(
        self, M: int, N: int, K: int, trans_a: bool, threads: int, paired: bool = False
    ) -> tuple[int, int, int]:
        """ProductPlan's cut, a pair's products on their share of the threads."""
        if not paired:
            return super().cut(M, N, K, trans_a, threads, paired)
        share = max(1, (self.cut_as_for or threads) // self.pair_split)
        return ProductPlan.cut(dataclasses.replace(self, cut_as_for=0), M, N, K, trans_a, share,
                               paired)  # fmt: skip


def parse_plan(spec: str) -> ProductPlan:
    """A plan from its name: default, fixedN, or FIELD=VALUE fields joined by '+'."""
    if spec == "default":
        return default_plan()
    if spec.startswith("fixed"):
        return FixedPlan(blocks=int(spec[5:]))
    fields = {}
    for item in spec.split("+"):
        field, _, value = item.partition("=")
        kind = type(getattr(SplitPairPlan(), field))
        fields[field] = value == "1" if kind is bool else kind(int(value))
    if "pair_split" in fields:
        return SplitPairPlan(**{**dataclasses.asdict(default_plan()), **fields})
    return dataclasses.replace(default_plan(), **fields)


def main(
    plans: Annotated[
        str, typer.Option(help="comma-separated plan names")
    ] = "default,many_threads=1048576,fixed16",
    preset: Annotated[str, typer.Option()] = "small",
    batch: Annotated[int, typer.Option("--batch-size")] = 16,
    seq: Annotated[int, typer.Option("--seq-len")] = 128,
    steps: Annotated[int, typer.Option(help="steps a plan a round")] = 10,
    rounds: Annotated[int, typer.Option()] = 8,
    untimed: Annotated[int, typer.Option("--untimed-steps")] = 5,
) -> None:
    """Print one JSON line: each plan's median ms a step over rounds, and the rounds."""
    cfg = get_preset(preset)
    tokens, targets = synthetic_batch(cfg, batch, seq)
    names = plans.split(",")
    engines = []
    for name in names:
        model = Model(cfg, backend=CpuBackend(plan=parse_plan(name)), seed=0)
        engines.append((model, AdamW(model)))
    losses = {}

    def step(name, model, opt) -> float:
        t0 = time.perf_counter()
        loss = model.forward(tokens, targets, need_grad=True)
        model.backward()
        opt.step(1e-3)
        losses[name] = float(loss)  # the last step's, after as many steps as the others
        return 1e3 * (time.perf_counter() - t0)

    for name, (model, opt) in zip(names, engines, strict=True):
        for _ in range(untimed):
            step(name, model, opt)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]  # neither plan always goes first
        for name in order:
            model, opt = engines[names.index(name)]
            per_round[name].append(
                round(statistics.median(step(name, model, opt) for _ in range(steps)), 2)
            )
    medians = {n: statistics.median(v) for n, v in per_round.items()}
    tokens_per_step = batch * seq
    print(json.dumps({
        "threads": numba.get_num_threads(), "preset": preset, "batch": batch, "seq": seq,
        "ms": medians,
        "tokens_per_s": {n: round(tokens_per_step / m * 1e3) for n, m in medians.items()},
        "rounds_ms": per_round,
        "last_losses_equal": len(set(losses.values())) == 1,
        "last_losses": losses,
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
