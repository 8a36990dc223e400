"""Where WGMMA's dkv kernel spends its time: the kernel with parts removed (timed, not checked).

    python bench/wgmma_ablation.py [--T 512,2048] [--out wgmma-ablation.json]

attention_tc.WGMMA (dkv's S^T and dP^T as warpgroup products) took the backward from 0.363
ms to 0.436 at T=512 on the H200 (bench/notes_gpu.md, session 12). This times the dkv kernel
alone (bench/gpu_timing.timed) at B=32, H=12, G=4, E=64 as:
- mma-sync: the default (WGMMA off), for reference;
- wgmma: WGMMA on;
- no-round: without the in-place rounding of each landed Q and dO chunk (the tensor core
  truncates the raw values instead: errors grow, nothing is checked here);
- no-fence: without fence.proxy.async after those stores (unsafe by the memory model);
- lbo-128: core matrices 128 bytes apart along k, unpadded (CM_LBO; the dV and dK products'
  fragment loads then meet 2-way bank conflicts, the tensor core reads 128-byte-aligned
  core matrices).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import lengths_parser, timed  # noqa: E402
from euler.gpu import attention_tc  # noqa: E402

NAME = "backward_dkv_tc_kernel"


def ablations() -> dict[str, tuple]:
    """(kernel, dynamic shared bytes) of each timed dkv, by name (generated at E = 64)."""
    E = 64

    def built(src: str) -> tuple:
        return attention_tc._compile(NAME, src), attention_tc.shared_bytes(E)["dkv"]

    def without(src: str, *starts: str) -> str:
        return "\n".join(x for x in src.splitlines() if not x.strip().startswith(starts)) + "\n"

    kernels = {"mma-sync": built(attention_tc.sources(E)[NAME])}
    attention_tc.WGMMA = True
    src = attention_tc.sources(E)[NAME]
    rounding = ("x0, x1, x2, x3 = load4_shared(sm, cur + ck", "store4_shared(sm, cur + ck")
    kernels |= {
        "wgmma": built(src),
        "no-round": built(without(src, *rounding)),
        "no-fence": built(without(src, "fence_proxy_async()")),
    }
    attention_tc.CM_LBO = 128
    kernels["lbo-128"] = built(attention_tc.sources(E)[NAME])
    attention_tc.CM_LBO, attention_tc.WGMMA = 144, False
    return kernels


def main() -> None:
    args = lengths_parser(__doc__).parse_args()
    from euler.gpu.backend import GpuBackend

    be = GpuBackend(tf32=True)
    s, B, H, G, E = be.stream, args.batch, 12, 4, 64
    kernels = ablations()
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        rng = np.random.default_rng(0)
        qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
        dout = be.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
        lse, dsum = be.zeros((B, H, T), np.float32), be.zeros((B, H, T), np.float32)
        dqkv = be.zeros(qkv.shape, np.float32)
        grid = attention_tc._grid((T + 63) // 64, B * G, attention_tc.HEAVY_FIRST)
        run = (dqkv, dsum, dout, qkv, lse, H, G, np.float32(1.0 / math.sqrt(E)))
        for name, (kernel, nbytes) in kernels.items():

            def call(kernel=kernel, nbytes=nbytes, grid=grid, run=run) -> None:
                attention_tc._launch(kernel, grid, s, nbytes, *run)

            call()
            rows.append({"ablation": name, "B": B, "T": T, "dkv_ms": timed(s, call, args.reps)})
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
