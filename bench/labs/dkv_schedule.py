"""How well the tensor-core backward's dkv grid packs onto the GPU, counted (no GPU needed).

    python bench/labs/dkv_schedule.py [--T 512] [--slots 264]

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

--prep N,L puts PREP_BLOCKS's first row in front: N blocks of L iterations each (64 blocks
of 53 us, 9.2 iterations of 5.8 us, in session 16). With half an iteration of overhead a
block the makespan grows from 56 to 59 iterations, against 2.2 of the row's slot-time;
rows of blocks no longer than 3 iterations would cost nothing. Session 16 chose the rows'
order by this count (of all orders of rows 2-7, the least makespan: 0, 1, 6, 2, 4, 3, 5, 7,
half an iteration to one shorter); on the H200 that order gained nothing (session 17).
"""

from __future__ import annotations

import argparse
import heapq


def makespan(jobs: list[float], slots: int, first: tuple[float, ...] = ()) -> float:
    """Finish time of jobs (iterations each) dispatched in order onto slots, each to the slot
    that frees first (list scheduling, as the block scheduler does), after the jobs `first`."""
    free = [0.0] * slots
    for job in (*first, *jobs):
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def blocks(T: int, B: int, H: int, G: int, overhead: float, split: int) -> list[float]:
    """Iterations of each dkv block, those over `split` cut in two (0: none cut), longest
    first (the grid's order)."""
    nt, rep = T // 64, H // G
    jobs = []
    for j in range(nt):
        n = rep * (nt - j)
        parts = [n] if not split or n <= split else [n - n // 2, n // 2]
        jobs += [p + overhead for p in parts] * (B * G)
    return sorted(jobs, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--slots", type=int, default=264)
    ap.add_argument("--prep", default="64,9.2", help="PREP_BLOCKS's row: blocks,iterations")
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
    n, length = (float(x) for x in args.prep.split(","))
    for overhead in (0, 0.5, 1):
        whole = blocks(args.T, args.batch, H, G, overhead, 0)
        ideal = (sum(whole) + n * length) / args.slots
        line = f"overhead {overhead}, a prep row of {n:.0f} x {length}: ideal {ideal:.1f}, "
        line += f"heaviest first {makespan(whole, args.slots, (length,) * int(n)):.1f}; "
        line += "its blocks' length 1..10 instead: " + " ".join(
            f"{makespan(whole, args.slots, (x,) * int(n)):.0f}" for x in range(1, 11)
        )
        print(line)


if __name__ == "__main__":
    main()
