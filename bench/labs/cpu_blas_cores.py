"""Which OpenBLAS kernels does this CPU get, and how fast are they against PyTorch's?

    python bench/labs/cpu_blas_cores.py --cores default,own,SKYLAKEX,COOPERLAKE,HASWELL
    taskset -c 0-15 python bench/labs/cpu_blas_cores.py --cores default --copies 16 --preset gpu

OpenBLAS picks its kernels (its "core") from the CPU's model number; OPENBLAS_CORETYPE
overrides the pick (the lent machine's image sets Haswell). It is read when the library
loads, so each core runs in its own process: "default" with the environment as it is,
"own" with the variable unset (OpenBLAS's own pick), any other name set. Each process,
pinned to one core with one thread, times float32 products of the `small` step's shapes
(B T = 2048 rows) and prints one JSON line: the core OpenBLAS reports, LLVM's name for the
host CPU, its AVX-512 and AMX flags, and GFLOP/s per
shape, in the layouts the model uses (forward x W^T, dX = dY W, dW = X^T dY), and over all
of them; then PyTorch's on the same shapes.

`--copies N` runs N copies of every product at once, one a core on the first N cores of this
process's mask, each on one thread (OpenBLAS's from a Numba prange, PyTorch's from N Python
threads), and reports GFLOP/s a core: how much of a core's speed each library keeps when
every core computes, with no cut of ours in the way. `--preset gpu` times the 116M model's
shapes (B T = 2048 rows too) instead of `small`'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import typer
from numba import njit, prange  # loads NumPy, so its OpenBLAS, before euler is imported

from euler.cpu.blas import gemm  # so euler picks no kernel family: the process's env holds


def shapes(preset: str) -> list[tuple[str, int, int, int, bool, bool]]:
    """The step's products as the model runs them at B T = 2048 rows, (weight, M, N, K,
    trans_a, trans_b) of out (M, N) = op(a) op(b): the forward's x W^T, the backward's
    dY W (dX) and X^T dY (dW), for the qkv, gate-up, down and head weights."""
    from euler.model.config import get_preset

    cfg = get_preset(preset)
    d, f = cfg.d_model, cfg.ffn_hidden
    weights = [("qkv", cfg.qkv_dim, d), ("gateup", 2 * f, d), ("down", d, f),
               ("head", cfg.vocab_size, d)]  # fmt: skip
    rows = 2048
    return [
        *[(w, rows, n_out, n_in, False, True) for w, n_out, n_in in weights],
        *[(w, rows, n_in, n_out, False, False) for w, n_out, n_in in weights],
        *[(w, n_out, n_in, rows, True, False) for w, n_out, n_in in weights],
    ]


def _seconds(mul, reps: int) -> float:
    """Best seconds of reps calls of mul()."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        mul()
        best = min(best, time.perf_counter() - t0)
    return best


@njit(parallel=True, cache=True)
def _openblas_copies(out, a, b, ta, tb):
    """out[i] = op(a[i]) @ op(b[i]) for every copy i at once, one a thread, each one call of
    the package's single-threaded sgemm (euler.cpu.blas.gemm)."""
    for i in prange(out.shape[0]):
        M, N = out.shape[1], out.shape[2]
        K = a.shape[1] if ta else a.shape[2]
        gemm(M, N, K, a[i].ctypes.data, a.shape[2], b[i].ctypes.data, b.shape[2], 0.0,
             out[i].ctypes.data, N, False, trans_a=ta, trans_b=tb)  # fmt: skip


def _child(engine: str, reps: int, preset: str, copies: int) -> dict:
    """This process's products, with the engine named: GFLOP/s a core per shape (named
    M x N x K and its layout, nt, nn or tn) and over all of them (total work / total time),
    each product run as `copies` copies at once, one a core."""
    import numpy as np

    from euler.blas_kernels import cpu_flags

    flags = cpu_flags()
    isa = sorted(f for f in flags if f.startswith(("avx512f", "amx", "avx512_bf16", "avx2", "fma")))
    out: dict = {"engine": engine, "preset": preset, "copies": copies, "isa": isa}
    if engine == "torch":
        import torch

        torch.set_num_threads(1)  # each call on its caller's thread
        pool = ThreadPoolExecutor(copies)  # torch's matmul releases the GIL
        out["torch"] = torch.__version__
    else:
        import llvmlite.binding as llvm
        import numba

        from euler.cpu import blas

        numba.set_num_threads(copies)
        out.update(openblas_core=blas.core_name(), llvm_cpu=llvm.get_host_cpu_name())
    rng = np.random.default_rng(0)
    out["gflops"], flop, seconds = {}, 0, 0.0
    for weight, M, N, K, ta, tb in shapes(preset):
        # stored as the model stores them, used transposed
        a = rng.standard_normal((copies, K, M) if ta else (copies, M, K), np.float32)
        b = rng.standard_normal((copies, N, K) if tb else (copies, K, N), np.float32)
        if engine == "torch":
            ops = [(torch.from_numpy(x).T if ta else torch.from_numpy(x),
                    torch.from_numpy(y).T if tb else torch.from_numpy(y))
                   for x, y in zip(a, b, strict=True)]  # fmt: skip

            def mul(ops=ops):
                list(pool.map(lambda ab: torch.matmul(*ab), ops))
        else:
            c = np.empty((copies, M, N), np.float32)

            def mul(c=c, a=a, b=b, ta=ta, tb=tb):
                _openblas_copies(c, a, b, ta, tb)

        s = _seconds(mul, reps)
        name = f"{weight} {M}x{N}x{K} {'t' if ta else 'n'}{'t' if tb else 'n'}"
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
    preset: Annotated[str, typer.Option(help="Whose shapes: small or gpu.")] = "small",
    copies: Annotated[int, typer.Option(help="Copies at once, one a core.")] = 1,
    child: Annotated[str, typer.Option(hidden=True)] = "",
) -> None:
    """One JSON line per OpenBLAS core (and PyTorch): GFLOP/s a core of each shape."""
    if child:
        print(json.dumps(_child(child, reps, preset, copies)), flush=True)
        return
    mask = sorted(os.sched_getaffinity(0))
    if not 1 <= copies <= len(mask):
        raise typer.BadParameter(f"--copies: 1 to {len(mask)} (this process's cores)")
    first = ",".join(str(c) for c in mask[:copies])
    for engine in [*cores.split(","), *(["torch"] if torch else [])]:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   NUMBA_NUM_THREADS=str(copies))  # fmt: skip
        if engine == "own":  # OpenBLAS's own pick, whatever the environment names
            env.pop("OPENBLAS_CORETYPE", None)
        elif engine not in ("default", "torch"):
            env["OPENBLAS_CORETYPE"] = engine
        cmd = ["taskset", "-c", first, sys.executable, __file__, "--reps", str(reps),
               "--preset", preset, "--copies", str(copies), "--child", engine]  # fmt: skip
        subprocess.run(cmd, env=env, check=False)


if __name__ == "__main__":
    typer.run(main)
