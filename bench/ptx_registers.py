"""Compile time, registers and spills of the attention kernels, with no GPU.

    python bench/ptx_registers.py [--head-size 64] [--kernels tc|tiled|readable|all]
                                  [--set NAME=N]
                                  [--census [--sass DIR]]

Each kernel the launchers would start at the `gpu` preset's shapes is compiled to sm_90a
PTX with `cuda.compile_ptx` (timed: Numba's passes plus NVVM), then, when a CUDA toolkit's
`ptxas` is on PATH, assembled with `ptxas -v` for its registers, spill bytes and warnings. NVVM 13.5
writes PTX ISA 9.5 and ptxas 13.0 reads up to 9.0; the kernels use nothing newer, so the
version line is lowered for ptxas. docs/gpu.md quotes its output.
`--set NAME=N` sets a field of the tensor-core kernels' TcOptions (prep_span, prep_stages,
prep_flag_every) or of the register-tiled kernels' TileOptions (kstep;
bench/labs/attention_exact_tiles.py). "readable" is euler/gpu/attention.py, the exact path.

`--census` also counts the instructions of each kernel's main loop (the longest span from a
label back to a branch to it): in PTX, and, when ptxas, cuobjdump and nvdisasm (NVIDIA's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) are on PATH, in the SASS ptxas makes
of the whole kernel and of its longest loop. A loop's count holds both sides of its
branches: the tensor-core loops' flat and clamped copies of the next tile, of which a whole
tile runs only the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numba
import numba.cuda.dispatcher as dispatcher
import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.labs import attention_exact_tiles as attention_tiles  # noqa: E402
from euler.gpu import attention, attention_tc  # noqa: E402
from euler.gpu.attention_tc import launch as tc_launch  # noqa: E402


def launches(kind: str, E: int, fields: dict[str, int]) -> list[tuple]:
    """(kernel, args) of each launch of attention forward and backward at head size E (the
    tensor-core kernels' TcOptions, or the register-tiled kernels' TileOptions, with fields)."""
    calls = []
    dispatcher.CUDADispatcher.__getitem__ = lambda self, cfg: (
        lambda *args: calls.append((self, args))
    )
    attention._raise_shared_limit = lambda *a: None  # needs a loaded module, so a GPU
    tc_launch._zero_flags = lambda flags, stream: None  # and so does a memset
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    B, T, H, G = 2, 3, 4, 2
    qkv, out, lse = f32(B, T, (H + 2 * G) * E), f32(B, T, H * E), f32(B, H, T)
    if kind == "tc":
        opts = attention_tc.TcOptions(E, **fields)
        attention_tc.attention_forward(out, lse, qkv, H, G, E, options=opts)
        dqkv = f32(*qkv.shape)
        flags = np.zeros(attention_tc.flag_count(B, H, T), np.int32)
        attention_tc.attention_backward(dqkv, out, qkv, out, lse, H, G, E, lse, options=opts,
                                        flags=flags)  # fmt: skip
    elif kind == "tiled":  # the lab's register-tiled kernels, as its launchers start them
        fwd, dkv = attention_tiles.kernels(E, attention_tiles.TileOptions(**fields))
        scale = np.float32(1.0 / np.sqrt(E))
        calls.append((fwd, (out, lse, qkv, H, G, scale)))
        calls.append((dkv, (f32(*qkv.shape), lse, out, qkv, lse, H, G, scale)))
    else:  # the readable kernels
        attention.attention_forward(out, lse, qkv, H, G, E, 0, 0)
        attention.attention_backward(f32(*qkv.shape), out, qkv, out, lse, H, G, E, lse, 0, 0)
    return [(k, a) for k, a in calls if "prep" not in k.py_func.__name__]


def ptxas_report(ptx: str) -> str:
    """ptxas -v's register and spill lines for one kernel's PTX, or why there are none."""
    if shutil.which("ptxas") is None:
        return "(no ptxas on PATH)"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx.replace(".version 9.5", ".version 9.0"))
        r = subprocess.run(
            ["ptxas", "-arch=sm_90a", "-v", str(path), "-o", "/dev/null"],
            capture_output=True,
            text=True,
        )
    lines = [ln.split("info    : ")[-1].strip() for ln in r.stderr.splitlines()]
    keep = ("registers", "spill", "warning")
    return "; ".join(ln for ln in lines if any(k in ln for k in keep)) or r.stderr


CENSUS_OPS = ("mma.sync", "ld.shared", "st.shared", "cvt.rna.tf32", "ex2.approx", "cp.async",
              "shfl.sync")  # fmt: skip


def loop_census(ptx: str) -> str:
    """Instruction counts of the PTX's longest loop body: the total and CENSUS_OPS's."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.fullmatch(r"\$L__BB\d+_\d+:", ln)}
    spans = [(labels[m.group(1)], i) for i, ln in enumerate(lines)
             if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln))
             and labels.get(m.group(1), i) < i]  # fmt: skip
    if not spans:
        return "no loop"
    a, b = max(spans, key=lambda s: s[1] - s[0])
    body = [ln.split()[1] if ln.startswith("@") else ln.split()[0] for ln in lines[a + 1 : b + 1]
            if ln and ln[0] not in "/.{}$" and ln.endswith(";")]  # fmt: skip
    counts = {op: sum(i.startswith(op) for i in body) for op in CENSUS_OPS}
    return f"loop {len(body)} PTX instructions: " + ", ".join(f"{n} {o}" for o, n in counts.items())


def sass_loop(sass: str) -> str:
    """The SASS instructions of the longest loop (the widest span from a branch back to its
    target, its end included), by opcode, most frequent first."""
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    jumps = [(int(m.group(1), 16), a) for a, t in ins if (m := re.search(r"\bBRA\s+0x(\w+)", t))]
    back = [(target, a) for target, a in jumps if target < a]
    if not back:
        return "no SASS loop"
    lo, hi = max(back, key=lambda s: s[1] - s[0])
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for a, t in ins if lo <= a <= hi)
    top = ", ".join(f"{n} {op}" for op, n in ops.most_common(12))
    return f"SASS loop {sum(ops.values())} instructions: {top}"


def sass_census(ptx: str, listing: Path | None = None) -> str:
    """The SASS opcodes ptxas makes of the kernel, most frequent first, then its longest
    loop's (sass_loop) (ptxas, cuobjdump, nvdisasm); listing: write the SASS there too."""
    if any(shutil.which(tool) is None for tool in ("ptxas", "cuobjdump", "nvdisasm")):
        return "(no ptxas, cuobjdump or nvdisasm on PATH)"
    with tempfile.TemporaryDirectory() as tmp:
        path, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        path.write_text(ptx.replace(".version 9.5", ".version 9.0"))
        subprocess.run(["ptxas", "-arch=sm_90a", str(path), "-o", str(cubin)], check=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
    if listing:
        listing.write_text(sass.stdout)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass.stdout)
    whole = "SASS " + ", ".join(f"{n} {op}" for op, n in Counter(ops).most_common(12))
    return f"{whole}\n    {sass_loop(sass.stdout)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--kernels", choices=["tc", "tiled", "readable", "all"], default="all")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=N",
        help="a TcOptions field (prep_span, prep_stages, prep_flag_every) or a TileOptions"
        " field (kstep); repeatable",
    )  # fmt: skip
    ap.add_argument("--census", action="store_true", help="instruction counts, PTX and SASS")
    ap.add_argument("--sass", type=Path, metavar="DIR",
                    help="with --census: each kernel's SASS listing to DIR/NAME.sass")  # fmt: skip
    args = ap.parse_args()
    tc_names = {f.name for f in dataclasses.fields(attention_tc.TcOptions)}
    tc_names -= {"head_size", "simulator"}
    tile_names = {f.name for f in dataclasses.fields(attention_tiles.TileOptions)}
    names = sorted(tc_names | tile_names)
    fields: dict[str, dict[str, int]] = {"tc": {}, "tiled": {}, "readable": {}}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in names or not value.lstrip("-").isdigit():
            ap.error(f"--set {item}: want NAME=N, NAME one of {', '.join(names)}")
        fields["tc" if name in tc_names else "tiled"][name] = int(value)
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    kinds = ["tc", "tiled", "readable"] if args.kernels == "all" else [args.kernels]
    for kind in kinds:
        for kernel, kargs in launches(kind, args.head_size, fields[kind]):
            sig = tuple(numba.typeof(a) for a in kargs)
            bounds = kernel.targetoptions.get("launch_bounds")
            t0 = time.perf_counter()
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0, "a"), launch_bounds=bounds)
            dt = time.perf_counter() - t0
            print(f"{kernel.py_func.__name__:28s} {dt:6.1f} s  {ptxas_report(ptx)}", flush=True)
            if args.census:
                name = kernel.py_func.__name__
                listing = args.sass / f"{name}.sass" if args.sass else None
                if listing:
                    args.sass.mkdir(parents=True, exist_ok=True)
                print(f"    {loop_census(ptx)}\n    {sass_census(ptx, listing)}", flush=True)


if __name__ == "__main__":
    main()
