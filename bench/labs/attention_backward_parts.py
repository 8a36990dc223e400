"""The tensor-core backward's parts, timed alone on a GPU (launch-free, not checked).

    python bench/labs/attention_backward_parts.py [--T 512,2048] [--out parts.json]

At B=32, H=12, G=4, E=64 (bench/gpu_timing.timed, 10 calls back to back):

- prep: attention.backward_prep (D = rowsum(dO O) and dQ's zeros), the backward's first
  kernel where T is not a multiple of 64;
- dkv: the dkv kernel alone, without its prep row (prep = 0, the prep kernel's partner),
  and with its dQ atomics behind a test the compiler cannot decide (scale < 0: the
  products stay, the adds go; its dQ is wrong by design);
- backward: attention_tc.attention_backward whole, and the forward for the ratio;
- prep blocks alone: the dkv grid's first row without the dkv blocks (grid (B G, 1)):
  how long its B G blocks take to do the prep kernel's work.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import lengths_parser, timed  # noqa: E402
from euler.gpu import attention, attention_tc  # noqa: E402
from euler.gpu.attention_tc import launch as tc_launch  # noqa: E402

NEVER = "scale < T(0.0)"  # false at run time (scale > 0), unknown to the compiler
OPTIONS = attention_tc.TcOptions(64)


def no_atomics(src: str) -> str:
    """The dkv source with each of dQ's atomic adds guarded by NEVER (the clamped rows' tests
    and the whole tile's one)."""

    def guarded(line: str) -> str:
        if line.strip().startswith("if rq +"):
            return line.replace("< Tn:", f"< Tn and {NEVER}:")
        return line.replace("if whole:", f"if whole and {NEVER}:")

    return "\n".join(guarded(line) for line in src.splitlines()) + "\n"


def calls_at(be, B: int, T: int, dkv, dkv_ablated) -> dict:
    """Each part's call on random data of batch B, length T, by name."""
    s, H, G, E = be.stream, 12, 4, 64
    rng = np.random.default_rng(0)
    qkv = be.to_device(rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32))
    dout = be.to_device(rng.standard_normal((B, T, H * E)).astype(np.float32))
    out, lse = be.zeros((B, T, H * E), np.float32), be.zeros((B, H, T), np.float32)
    dqkv, dsum = be.zeros(qkv.shape, np.float32), be.zeros((B, H, T), np.float32)
    scale = np.float32(1.0 / math.sqrt(E))
    grid = (B * G, (T + 63) // 64)  # kv heads on the fast axis, heaviest key tiles first
    nbytes = attention_tc.shared_bytes(OPTIONS)["dkv"]
    args = (dqkv, dsum, dout, qkv, lse, H, G, scale, out)
    flags = be.zeros((attention_tc.flag_count(B, H, T),), np.int32)
    unfused = (flags, 0)  # no prep row: no flag read

    def launch(kernel, grid, *more):
        attention.launch_dynamic(kernel, grid, tc_launch.THREADS, s, nbytes, *args, *more)

    return {
        "forward": lambda: attention_tc.attention_forward(out, lse, qkv, H, G, E, s),
        "backward": lambda: attention_tc.attention_backward(
            dqkv, dout, qkv, out, lse, H, G, E, dsum, s, flags=flags
        ),
        "prep": lambda: attention.backward_prep(dqkv, dsum, dout, out, H, E, s),
        "dkv": lambda: launch(dkv, grid, *unfused),
        "dkv no atomics": lambda: launch(dkv_ablated, grid, *unfused),
        "prep blocks alone": lambda: launch(dkv, (grid[0], 1), flags, 1),  # raise, never wait
    }


def main() -> None:
    args = lengths_parser(__doc__).parse_args()
    from euler.gpu.backend import GpuBackend

    be = GpuBackend(tf32=True)
    name = "backward_dkv_tc_kernel"
    dkv = attention_tc.kernels(OPTIONS).dkv
    dkv_ablated = attention_tc.compile_kernel(name, no_atomics(attention_tc.sources(OPTIONS)[name]))
    rows = []
    for T in (int(x) for x in args.T.split(",")):
        parts = calls_at(be, args.batch, T, dkv, dkv_ablated)
        for part, call in parts.items():
            call()
            rows.append(
                {"part": part, "B": args.batch, "T": T, "ms": timed(be.stream, call, args.reps)}
            )
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
