"""How well the tensor-core backward's dkv grid packs onto the GPU, counted (no GPU needed).

    python bench/labs/dkv_schedule.py [--T 512] [--slots 264]

List scheduling of the dkv grid (euler/gpu/schedule.py), heaviest block first. With
--overhead c every block costs c iterations more (its K, V staging and dK, dV stores).
Printed per overhead: the ideal (total iterations / slots), the heaviest-first makespan,
and the makespan when every block over --split iterations is cut in two (which would need
dK and dV added by atomics). --prep N,L puts the prep blocks' first row in front: N blocks
of L iterations each. The H200 holds two dkv blocks per multiprocessor, so 264 slots on its
132.
"""

from __future__ import annotations

import argparse

from euler.gpu.schedule import dkv_blocks, makespan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--slots", type=int, default=264)
    ap.add_argument("--prep", default="64,9.2", help="the prep row: blocks,iterations")
    args = ap.parse_args()
    H, G = 12, 4
    for overhead in (0, 1, 2):
        whole = dkv_blocks(args.T, args.batch, H, G, overhead, 0)
        line = f"overhead {overhead}: ideal {sum(whole) / args.slots:.1f}, "
        line += f"heaviest first {makespan(whole, args.slots):.0f}"
        for split in (12, 15, 18):
            cut = dkv_blocks(args.T, args.batch, H, G, overhead, split)
            line += f", split over {split}: {makespan(cut, args.slots):.0f}"
        print(line)
    n, length = (float(x) for x in args.prep.split(","))
    for overhead in (0, 0.5, 1):
        whole = dkv_blocks(args.T, args.batch, H, G, overhead, 0)
        ideal = (sum(whole) + n * length) / args.slots
        line = f"overhead {overhead}, a prep row of {n:.0f} x {length}: ideal {ideal:.1f}, "
        line += f"heaviest first {makespan(whole, args.slots, (length,) * int(n)):.1f}; "
        line += "its blocks' length 1..10 instead: " + " ".join(
            f"{makespan(whole, args.slots, (x,) * int(n)):.0f}" for x in range(1, 11)
        )
        print(line)


if __name__ == "__main__":
    main()
