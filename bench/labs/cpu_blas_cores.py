"""Which OpenBLAS kernels does this CPU get, and how fast are they against PyTorch's?

    python bench/labs/cpu_blas_cores.py --cores default,own,SKYLAKEX,COOPERLAKE,HASWELL

OpenBLAS picks its kernels (its "core") from the CPU's model number; OPENBLAS_CORETYPE
overrides the pick (the lent machine's image sets Haswell). It is read when the library
loads, so each core runs in its own process: "default" with the environment as it is,
"own" with the variable unset (OpenBLAS's own pick), any other name set. Each process,
pinned to one core with one thread, times float32 products of the `small` step's shapes
(B T = 2048 rows) and prints one JSON line: the core OpenBLAS reports, LLVM's name for the
host CPU, its AVX-512 and AMX flags, and GFLOP/s per
shape, in the layouts the model uses (forward x W^T, dX = dY W, dW = X^T dY), and over all
of them; then PyTorch's on the same shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Annotated

import typer

# The small step's products as the model runs them, (M, N, K, trans_a, trans_b) of
# out (M, N) = op(a) op(b): the forward's x W^T, the backward's dY W (dX) and X^T dY (dW)
SHAPES = [
    *[(2048, n, k, False, True) for n, k in [(256, 128), (682, 128), (128, 341), (512, 128)]],
    *[(2048, n, k, False, False) for n, k in [(128, 256), (128, 682), (341, 128), (128, 512)]],
    *[(m, n, 2048, True, False) for m, n in [(256, 128), (682, 128), (128, 341), (512, 128)]],
]  # fmt: skip


def _seconds(mul, a, b, reps: int) -> float:
    """Best seconds of reps calls of mul(a, b)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        mul(a, b)
        best = min(best, time.perf_counter() - t0)
    return best


def _child(engine: str, reps: int) -> dict:
    """This process's products, with the engine named: GFLOP/s per shape (named M x N x K
    and its layout, nt, nn or tn) and over all of them (total work / total time)."""
    import numpy as np

    rng = np.random.default_rng(0)
    mats = []
    for M, N, K, ta, tb in SHAPES:  # stored as the model stores them, used transposed
        a = rng.standard_normal((K, M) if ta else (M, K), np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), np.float32)
        mats.append((a, b))
    from euler.blas_kernels import cpu_flags  # after NumPy: euler must not pick the family

    flags = cpu_flags()
    out: dict = {"engine": engine, "isa": sorted(f for f in flags if f.startswith(("avx512f",
                 "amx", "avx512_bf16", "avx2", "fma")))}  # fmt: skip
    if engine == "torch":
        import torch

        torch.set_num_threads(1)
        matmul = torch.matmul
        mats = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in mats]
        out["torch"] = torch.__version__
    else:
        import llvmlite.binding as llvm

        from euler.cpu import blas

        matmul = np.matmul
        out.update(openblas_core=blas.core_name(), llvm_cpu=llvm.get_host_cpu_name())
    out["gflops"], flop, seconds = {}, 0, 0.0
    for (M, N, K, ta, tb), (a, b) in zip(SHAPES, mats, strict=True):

        def mul(a, b, ta=ta, tb=tb):
            return matmul(a.T if ta else a, b.T if tb else b)

        s = _seconds(mul, a, b, reps)
        name = f"{M}x{N}x{K} {'t' if ta else 'n'}{'t' if tb else 'n'}"
        out["gflops"][name] = round(2 * M * N * K / s / 1e9, 1)
        flop, seconds = flop + 2 * M * N * K, seconds + s
    out["gflops_all"] = round(flop / seconds / 1e9, 1)
    return out


def main(
    cores: Annotated[
        str,
        typer.Option(help="OPENBLAS_CORETYPE values; default: the environment's; own: unset."),
    ] = "default,own,SKYLAKEX,COOPERLAKE,SAPPHIRERAPIDS,HASWELL",
    reps: Annotated[int, typer.Option(help="Calls a shape; the best is kept.")] = 30,
    torch: Annotated[bool, typer.Option(help="Time PyTorch's products too.")] = True,
    child: Annotated[str, typer.Option(hidden=True)] = "",
) -> None:
    """One JSON line per OpenBLAS core (and PyTorch): GFLOP/s of each shape on one core."""
    if child:
        print(json.dumps(_child(child, reps)), flush=True)
        return
    first = str(min(os.sched_getaffinity(0)))
    for engine in [*cores.split(","), *(["torch"] if torch else [])]:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   NUMBA_NUM_THREADS="1")  # fmt: skip
        if engine == "own":  # OpenBLAS's own pick, whatever the environment names
            env.pop("OPENBLAS_CORETYPE", None)
        elif engine not in ("default", "torch"):
            env["OPENBLAS_CORETYPE"] = engine
        cmd = ["taskset", "-c", first, sys.executable, __file__, "--reps", str(reps),
               "--child", engine]  # fmt: skip
        subprocess.run(cmd, env=env, check=False)


if __name__ == "__main__":
    typer.run(main)
