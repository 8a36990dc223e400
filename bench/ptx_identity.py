"""Fingerprint every package kernel's sm_90 PTX, with no GPU: proof that a refactor kept them.

    NUMBA_ENABLE_CUDASIM=0 python bench/ptx_identity.py --out before.json   # in the old tree
    NUMBA_ENABLE_CUDASIM=0 python bench/ptx_identity.py --out after.json    # in the new one
    python bench/ptx_identity.py --compare before.json after.json [--json result.json]

The launches are those tests/test_gpu_ptx.py drives (each launcher on small host arrays,
launches intercepted), so each kernel is compiled for exactly the argument types its
launcher passes, as CI does. A kernel's key is `name(argument types)#k`, k counting the
kernels of that key in launch order (a factory's kernels share a name). The JSON maps key ->
sha256 of the PTX with its header comments dropped (they name the compiler build) and its
mangled symbols and shared arrays numbered in order of appearance (they name the defining
module, or a count of the process's compiles, so a kernel moved between files keeps its
hash), and where a CUDA toolkit's `ptxas` is on PATH, its registers and spills
(bench/ptx_registers.py).
`--compare` lists the keys identical, changed and only on one side; run it from either tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path.cwd()
MANGLED = re.compile(r"_Z[A-Za-z0-9_$]+|_cudapy_smem_\d+")  # symbols named by module or counter


def fingerprints(dump: Path | None = None) -> dict[str, dict[str, str]]:
    """key -> {"sha256": ..., "ptxas": ...} of every kernel tests/test_gpu_ptx.py launches;
    with dump, each normalized PTX is written there too (name#k.ptx), to diff two trees'."""
    sys.path.insert(0, str(ROOT))
    import numba
    import numba.cuda.dispatcher as dispatcher
    import pytest
    from numba import cuda

    from bench.ptx_registers import ptxas_report
    from tests import test_gpu_ptx

    mp = pytest.MonkeyPatch()
    calls = test_gpu_ptx._launches(mp)
    mp.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(compute_capability=(9, 0)))
    out: dict[str, dict[str, str]] = {}
    seen: set = set()
    for kernel, args in calls:
        sig = tuple(numba.typeof(a) for a in args)
        if (kernel, sig) in seen:
            continue
        seen.add((kernel, sig))
        f = kernel.py_func
        base = f"{f.__name__}({', '.join(map(str, sig))})"
        k = sum(key.startswith(base + "#") for key in out)
        ptx, _ = cuda.compile_ptx(f, sig, cc=(9, 0))
        text = normalized(ptx)
        entry = {"sha256": hashlib.sha256(text.encode()).hexdigest()}
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{f.__name__}#{len(out)}.ptx").write_text(text)
        entry["ptxas"] = ptxas_report(ptx)
        out[f"{base}#{k}"] = entry
        print(f"{base}#{k} {entry['sha256'][:12]} {entry['ptxas']}", flush=True)
    mp.undo()
    return out


def normalized(ptx: str) -> str:
    """ptx without its comment lines, each mangled symbol replaced by its order of first use."""
    names: dict[str, str] = {}
    body = "\n".join(ln for ln in ptx.splitlines() if not ln.startswith("//"))
    return MANGLED.sub(lambda m: names.setdefault(m.group(0), f"_sym{len(names)}"), body)


def compare(before: dict, after: dict) -> dict[str, list]:
    """Keys identical, changed (with both ptxas reports) and only on one side."""
    both = sorted(before.keys() & after.keys())
    return {
        "identical": [k for k in both if before[k]["sha256"] == after[k]["sha256"]],
        "changed": [
            {"kernel": k, "before": before[k]["ptxas"], "after": after[k]["ptxas"]}
            for k in both
            if before[k]["sha256"] != after[k]["sha256"]
        ],
        "only_before": sorted(before.keys() - after.keys()),
        "only_after": sorted(after.keys() - before.keys()),
    }


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write this tree's fingerprints here")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    p.add_argument("--json", type=Path, help="with --compare: write the comparison here")
    p.add_argument("--dump", type=Path, help="also write each kernel's normalized PTX here")
    a = p.parse_args()
    if a.compare:
        try:
            before, after = (json.loads(f.read_text()) for f in a.compare)
        except (OSError, ValueError) as e:
            sys.exit(f"ptx_identity: cannot read {e}")
        result = compare(before, after)
        for name, keys in result.items():
            print(f"{name}: {len(keys)}")
            if name != "identical":
                for k in keys:
                    print(f"  {k}")
        if a.json:
            _write(a.json, {"before": str(a.compare[0]), "after": str(a.compare[1]), **result})
        return
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("ptx_identity: compiles real PTX; unset NUMBA_ENABLE_CUDASIM")
    if a.out is None:
        sys.exit("ptx_identity: give --out FILE or --compare BEFORE AFTER")
    _write(a.out, fingerprints(a.dump))


if __name__ == "__main__":
    main()
