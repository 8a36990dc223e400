"""How the tensor-core backward's dkv grid packs onto a GPU's block slots, counted.

The block scheduler gives each block, in launch order, the slot that frees first: list
scheduling. A dkv block (attention_tc.backward) owns one 64-key tile j of one kv head and
runs one iteration per (query head of its group, query tile at or after j): rep (T / 64 - j)
for key tile j. Its grid is dispatched heaviest first, after the row of prep blocks.
bench/labs/dkv_schedule.py prints these counts; no GPU is needed.
"""

from __future__ import annotations

import heapq


def makespan(jobs: list[float], slots: int, first: tuple[float, ...] = ()) -> float:
    """Finish time of jobs (iterations each) dispatched in order onto slots, each to the slot
    that frees first (list scheduling, as the block scheduler does), after the jobs `first`."""
    free = [0.0] * slots
    for job in (*first, *jobs):
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def dkv_blocks(T: int, B: int, H: int, G: int, overhead: float, split: int = 0) -> list[float]:
    """Iterations of each dkv block for B batch elements, H query and G kv heads of length T
    (a multiple of 64), each block `overhead` iterations more (its K, V staging and dK, dV
    stores), those over `split` iterations cut in two (0: none cut), longest first (the
    grid's order)."""
    nt, rep = T // 64, H // G
    jobs = []
    for j in range(nt):
        n = rep * (nt - j)
        parts = [n] if not split or n <= split else [n - n // 2, n // 2]
        jobs += [p + overhead for p in parts] * (B * G)
    return sorted(jobs, reverse=True)
