"""How well the tensor-core backward's dkv grid packs onto the GPU, counted (no GPU needed).

    python bench/dkv_schedule.py [--T 512] [--slots 264]

A dkv block (attention_tc) owns one 64-key tile of one kv head and runs one iteration per
(query head of its group, query tile at or after its key tile): rep (T / 64 - j) for key
tile j. The grid is dispatched heaviest first (HEAVY_FIRST), each block taking the slot
that frees first: list scheduling, longest first. With --overhead c every block costs c
iterations more (its K, V staging and dK, dV stores). Printed per overhead: the ideal
(total iterations / slots), the heaviest-first makespan, and the makespan when every block
over --split iterations is cut in two (which would need dK and dV added by atomics).

The H200 holds two dkv blocks per multiprocessor (235 registers, 105 KB of shared memory),
so 264 slots on its 132. At T=512 (B=32, 12 query heads, 4 kv heads): ideal 52.4
iterations a slot, heaviest first 54, and no split does better (session 11).
"""

from __future__ import annotations

import argparse
import heapq


def makespan(jobs: list[float], slots: int) -> float:
    """Finish time of jobs (iterations each) dispatched longest first onto slots."""
    free = [0.0] * slots
    for job in sorted(jobs, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def blocks(T: int, B: int, H: int, G: int, overhead: float, split: int) -> list[float]:
    """Iterations of each dkv block, those over `split` cut in two (0: none cut)."""
    nt, rep = T // 64, H // G
    jobs = []
    for j in range(nt):
        n = rep * (nt - j)
        parts = [n] if not split or n <= split else [n - n // 2, n // 2]
        jobs += [p + overhead for p in parts] * (B * G)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--slots", type=int, default=264)
    args = ap.parse_args()
    H, G = 12, 4
    for overhead in (0, 1, 2):
        whole = blocks(args.T, args.batch, H, G, overhead, 0)
        line = f"overhead {overhead}: ideal {sum(whole) / args.slots:.1f}, "
        line += f"heaviest first {makespan(whole, args.slots):.0f}"
        for split in (12, 15, 18):
            cut = blocks(args.T, args.batch, H, G, overhead, split)
            line += f", split over {split}: {makespan(cut, args.slots):.0f}"
        print(line)


if __name__ == "__main__":
    main()
