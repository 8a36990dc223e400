"""The readable exact attention beside today's other GPU attentions, checked and timed.

    python bench/attention_exact_gpu.py --json attention-exact.json        # on a GPU
    python bench/attention_exact_gpu.py --simulate --json /tmp/sim.json    # tiny, no GPU

At the `gpu` preset's heads (H=12, G=4, E=64; --batch-size, 32 as `euler bench --preset gpu`)
and each of --T (512 and 2048), forward and backward of:

- readable: euler/gpu/attention.py, the `--exact-attention` / fp32 path;
- tiles: the generated register-tiled exact kernels it replaced there
  (bench/labs/attention_exact_tiles.py);
- tc-tf32, tc-bf16: the tensor-core kernels (euler/gpu/attention_tc/) that run by default
  (tf32) and at `--precision bf16`; bf16 reads qkv and dout rounded to bf16.

Each is checked against the readable kernels on the same inputs (bf16: the readable kernels
on the bf16-rounded values), and the readable kernels against the CPU kernel
(euler/cpu/attention.py) on batch element 0: max |difference| of out, lse and dqkv, with the
reference's largest |value| beside it. Times are the median device ms of one call
(bench/gpu_timing.py: rounds of calls back to back behind a spin, so the host's launch is
not timed); TFLOP/s count the useful causal work, 4 B H T^2 E / 2 forward, 2.5 times that
backward. Prints a table and writes every row to --json.

--simulate runs the same code in the CUDA simulator on one tiny shape (B=1, T=64, H=2,
G=1, E=16; wall-clock times of one call, meaningless as speed) so that the script itself is
checked without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IMPLS = ("readable", "tiles", "tc-tf32", "tc-bf16")
START = time.perf_counter()


class Case:
    """One shape's host inputs and device arrays; each implementation's forward and backward
    write the same out, lse and dqkv."""

    def __init__(self, B: int, T: int, H: int, G: int, E: int, seed: int = 0):
        from numba import cuda

        from euler.precision import from_bf16, to_bf16

        self.B, self.T, self.H, self.G, self.E = B, T, H, G, E
        rng = np.random.default_rng(seed)
        self.qkv_h = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(np.float32)
        self.dout_h = rng.standard_normal((B, T, H * E)).astype(np.float32)
        self.stream = cuda.stream()
        dev = cuda.to_device
        self.qkv, self.dout = dev(self.qkv_h), dev(self.dout_h)
        self.qkv16, self.dout16 = dev(to_bf16(self.qkv_h)), dev(to_bf16(self.dout_h))
        # the bf16 inputs' values in float32: the readable kernels' reference for tc-bf16
        self.qkv_r, self.dout_r = (
            dev(from_bf16(to_bf16(self.qkv_h))),
            dev(from_bf16(to_bf16(self.dout_h))),
        )
        self.out = cuda.device_array((B, T, H * E), np.float32)
        self.out16 = cuda.device_array((B, T, H * E), np.uint16)
        self.lse, self.dsum = (cuda.device_array((B, H, T), np.float32) for _ in range(2))
        self.dqkv = cuda.device_array(self.qkv_h.shape, np.float32)

    def calls(self, impl: str) -> tuple:
        """(forward, backward) of one implementation on this case's arrays."""
        from bench.labs import attention_exact_tiles
        from euler.gpu import attention, attention_tc

        H, G, E, s = self.H, self.G, self.E, self.stream
        mod = {"readable": attention, "readable-bf16-inputs": attention}.get(impl)
        mod = mod or (attention_exact_tiles if impl == "tiles" else attention_tc)
        bf16 = impl == "tc-bf16"
        rounded = impl == "readable-bf16-inputs"
        qkv = self.qkv16 if bf16 else self.qkv_r if rounded else self.qkv
        dout = self.dout16 if bf16 else self.dout_r if rounded else self.dout
        out = self.out16 if bf16 else self.out

        def forward():
            mod.attention_forward(out, self.lse, qkv, H, G, E, s)

        def backward():
            mod.attention_backward(self.dqkv, dout, qkv, out, self.lse, H, G, E, self.dsum, s)

        return forward, backward

    def results(self, impl: str) -> list[np.ndarray]:
        """[out, lse, dqkv] on the host after impl's forward then backward."""
        from euler.precision import from_bf16

        forward, backward = self.calls(impl)
        self.dqkv.copy_to_device(np.full(self.qkv_h.shape, np.nan, np.float32))
        forward()
        backward()
        self.stream.synchronize()
        out = from_bf16(self.out16.copy_to_host()) if impl == "tc-bf16" else self.out.copy_to_host()
        return [out, self.lse.copy_to_host(), self.dqkv.copy_to_host()]

    def cpu(self) -> list[np.ndarray]:
        """[out, lse, dqkv] of the CPU kernel on batch element 0."""
        from euler.cpu import attention as cpu_attention

        qkv, dout = self.qkv_h[:1], self.dout_h[:1]
        H, G, E, T = self.H, self.G, self.E, self.T
        out, lse = np.zeros((1, T, H * E), np.float32), np.zeros((1, H, T), np.float32)
        cpu_attention.attention_forward(out, lse, qkv, H, G, E, cpu_attention.TILE)
        dqkv = np.zeros_like(qkv)
        cpu_attention.attention_backward(dqkv, dout, qkv, out, lse, H, G, E, cpu_attention.TILE)
        return [out, lse, dqkv]


def errors(got: list, want: list) -> dict[str, float]:
    """Max |got - want| of out, lse, dqkv and the reference's largest |value| of each."""
    names = ("out", "lse", "dqkv")
    err = {f"{n}_err": float(np.abs(g - w).max()) for n, g, w in zip(names, got, want, strict=True)}
    err.update({f"{n}_scale": float(np.abs(w).max()) for n, w in zip(names, want, strict=True)})
    return err


def wall_ms(stream, fn, reps: int) -> float:
    """Wall-clock ms of one call (the simulator's stand-in for gpu_timing.timed)."""
    t0 = time.perf_counter()
    fn()
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e3


def progress(what: str) -> None:
    """One line on stderr: seconds since the start, then what runs now."""
    print(f"[{time.perf_counter() - START:7.1f} s] {what}", file=sys.stderr, flush=True)


def run_case(c: Case, reps: int, timer, impls: list[str]) -> list[dict]:
    """One row per implementation: its errors and times."""
    from euler.gpu import attention_tc

    shape = dict(B=c.B, T=c.T, H=c.H, G=c.G, E=c.E)
    useful = 4 * c.B * c.H * c.T * c.T * c.E / 2
    progress(f"{shape}: readable kernels (the first call compiles)")
    readable = c.results("readable")
    progress("the CPU kernel on batch element 0")
    rows = [dict(impl="cpu-vs-readable", **shape, **errors([x[:1] for x in readable], c.cpu()))]
    print(json.dumps(rows[-1]), flush=True)
    rounded = None
    for impl in impls:
        if impl == "tiles" and c.E not in (8, 16, 32, 64):
            continue
        if impl.startswith("tc") and not attention_tc.supports(c.E, bf16=impl == "tc-bf16"):
            continue
        if impl == "tc-bf16":
            rounded = rounded or c.results("readable-bf16-inputs")
            want = rounded
        else:
            want = readable
        progress(impl)
        row = dict(impl=impl, **shape, **errors(c.results(impl), want))
        forward, backward = c.calls(impl)
        row["fwd_ms"] = timer(c.stream, forward, reps)
        row["bwd_ms"] = timer(c.stream, backward, reps)
        row["fwd_tflops"] = useful / row["fwd_ms"] / 1e9
        row["bwd_tflops"] = 2.5 * useful / row["bwd_ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width table."""
    head = f"{'impl':<16} {'B':>3} {'T':>5} {'fwd ms':>9} {'bwd ms':>9} {'fwd TF/s':>8} "
    head += f"{'bwd TF/s':>8} {'out err':>9} {'lse err':>9} {'dqkv err':>9}"
    lines = [head]
    for r in rows:
        t = (
            f"{r['fwd_ms']:>9.3f} {r['bwd_ms']:>9.3f} {r['fwd_tflops']:>8.2f} "
            f"{r['bwd_tflops']:>8.2f}"
            if "fwd_ms" in r
            else f"{'':>9} {'':>9} {'':>8} {'':>8}"
        )
        errs = f"{r['out_err']:>9.2e} {r['lse_err']:>9.2e} {r['dqkv_err']:>9.2e}"
        lines.append(f"{r['impl']:<16} {r['B']:>3} {r['T']:>5} {t} {errs}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="512,2048", help="sequence lengths, comma-separated")
    ap.add_argument("--batch-size", dest="batch", metavar="B", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10, help="timed rounds (bench/gpu_timing.py)")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"some of {', '.join(IMPLS)}")
    ap.add_argument("--simulate", action="store_true", help="tiny shape, CUDA simulator")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args()
    impls = args.impls.split(",")
    if not set(impls) <= set(IMPLS):
        ap.error(f"--impls: some of {', '.join(IMPLS)}, not {args.impls!r}")
    try:
        lengths = [int(t) for t in args.T.split(",")]
    except ValueError:
        ap.error(f"--T: comma-separated integers, not {args.T!r}")
    if args.simulate:  # before numba.cuda is first imported
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        shapes, timer = [(1, 64, 2, 1, 16)], wall_ms
    else:
        from bench.gpu_timing import timed

        shapes, timer = [(args.batch, T, 12, 4, 64) for T in lengths], timed
    rows: list[dict] = []
    for shape in shapes:
        rows += run_case(Case(*shape), args.reps, timer, impls)
        if args.json:
            tmp = args.json.with_suffix(".tmp")
            tmp.write_text(json.dumps({"simulated": args.simulate, "rows": rows}, indent=1))
            os.replace(tmp, args.json)
    print(table(rows))


if __name__ == "__main__":
    main()
