"""How a grid of blocks packs onto a GPU's block slots, counted (no GPU needed).

The block scheduler gives each block, in launch order, the slot that frees first: list
scheduling. The tensor-core backward's dkv grid (attention_tc) is a first row of prep
blocks, then one row of blocks per 64-key tile j, each block rep (T / 64 - j) iterations
long; which tile each row holds is ours to choose (attention_tc.ROW_ORDER). bench/
dkv_schedule.py prints these counts; attention_tc asks `row_order` for its rows.
"""

from __future__ import annotations

import heapq
import itertools
from functools import cache

# PREP_BLOCKS's prep unit in dkv iterations: 1.1 us against 5.8 us at T=512 on the H200
# (bench/notes_gpu.md, session 16; 48 units a prep block there)
PREP_UNIT = 0.19
OVERHEADS = (0.5, 1.0)  # a block's staging and stores, in iterations: orders are chosen for both


def makespan(jobs: list[float], slots: int, first: tuple[float, ...] = ()) -> float:
    """Finish time of jobs (iterations each) dispatched in order onto slots, each to the slot
    that frees first, after the jobs `first`."""
    free = [0.0] * slots
    for job in (*first, *jobs):
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def dkv_rows(order: list[int], nt: int, rep: int, pairs: int, overhead: float) -> list[float]:
    """The dkv grid's blocks in launch order: row r holds key tile order[r] of every pair."""
    return [rep * (nt - j) + overhead for j in order for _ in range(pairs)]


@cache
def row_order(
    nt: int, rep: int, pairs: int, slots: int, prep: int = 0, units: int = 0
) -> tuple[int, ...]:
    """Key tiles by grid row for a dkv grid of nt tiles, rep query heads a kv head, `pairs`
    (batch element, kv head) pairs, on `slots` block slots, after `prep` prep blocks of
    `units` units each: of all orders of the rows after the first two (720 at 8 tiles,
    under a second), the one of least counted makespan summed over OVERHEADS, heaviest
    first on ties. The first two rows stay: their blocks start while the prep runs, and a
    later tile's would wait for its units. Past 8 tiles, heaviest first (the counted
    gains there are under 0.3%)."""
    if nt > 8:
        return tuple(range(nt))
    rest = tuple(range(2, nt))

    def cost(order: tuple[int, ...]) -> float:
        first = (PREP_UNIT * units,) * prep
        rows = [*range(min(nt, 2)), *order]
        return sum(makespan(dkv_rows(rows, nt, rep, pairs, ov), slots, first) for ov in OVERHEADS)

    best = min(itertools.permutations(rest), key=lambda o: (cost(o), o != rest))
    return (*range(min(nt, 2)), *best)
