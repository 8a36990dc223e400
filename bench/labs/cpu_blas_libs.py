"""Which BLAS library multiplies the step's float32 shapes fastest on this CPU, per core?

    taskset -c 0-15 python bench/labs/cpu_blas_libs.py --preset gpu --copies 1,16 \\
        --openblas /tmp/site/scipy_openblas64/lib/libscipy_openblas64_.so

The package calls NumPy's OpenBLAS single-threaded from its own blocks (euler/cpu/blas.py).
On the lent Xeon's 16 cores its products ran at about 58 GFLOP/s a core in the `gpu`
preset's step against PyTorch's 83 (MKL inside PyTorch), while one core alone ran both at
110 to 130. This lab asks whether another library keeps more of a core's speed when every
core computes. Each library runs in its own process on this process's first N cores, N
copies of every product at once from N Python threads (ctypes and PyTorch release the GIL
in a call), each call on one thread:

- `numpy`: NumPy's OpenBLAS, the one the package uses;
- `openblas`: another OpenBLAS build, --openblas PATH (scipy-openblas64's newer release);
- `blis`: BLIS (the `blis` wheel exports its typed API; bli_sgemm takes row and column
  strides, so a transposed operand is its strides swapped);
- `torch`: PyTorch's matmul (MKL on x86 wheels), torch.set_num_threads(1);
- `euler`: the package's products (euler.cpu.blas.Products) on N of Numba's threads, one
  product at a time: the cut against the libraries' own threads; `euler:PLAN` cuts by
  another plan, named as bench/labs/cpu_plans.py names them (`euler:per_thread=1`).

`--threaded` also times one call on all N cores with the library's own threads (NumPy's
OpenBLAS, the other OpenBLAS and PyTorch; this BLIS build has no threads). One JSON line a
library and count: the kernel family or architecture it reports, GFLOP/s a core per shape
and over all shapes.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import numpy as np
import typer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_blas_cores import shapes  # noqa: E402  (the step's products, named by weight)

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


def _openblas(path: str) -> tuple[ctypes.CDLL, str]:
    """An OpenBLAS build with 64-bit integers at path ('' for NumPy's): the library, sgemm's
    symbol name."""
    from euler.blas_kernels import SGEMM, openblas, symbol

    lib = ctypes.CDLL(path) if path else openblas()
    return lib, symbol(lib, SGEMM)


def _openblas_mul(lib: ctypes.CDLL, name: str):
    """f(c, a, b, ta, tb): c (M, N) = op(a) op(b) through lib's cblas_sgemm."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, _I64, _I64, _I64, ctypes.c_float,
                   _PTR, _I64, _PTR, _I64, ctypes.c_float, _PTR, _I64]  # fmt: skip

    def mul(c, a, b, ta, tb):
        M, N = c.shape
        K = a.shape[0] if ta else a.shape[1]
        fn(_ROW_MAJOR, _TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, M, N, K, 1.0,
           a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 0.0, c.ctypes.data, N)  # fmt: skip

    return mul


def _openblas_info(lib: ctypes.CDLL) -> dict:
    """The build's config string and the kernel family it chose."""
    from euler.blas_kernels import CORE_NAME, symbol

    info = {}
    queries = {"config": ("scipy_openblas_get_config64_", "openblas_get_config64_"),
               "core": CORE_NAME}  # fmt: skip
    for key, names in queries.items():
        name = symbol(lib, names)
        if name:
            fn = getattr(lib, name)
            fn.restype = ctypes.c_char_p
            info[key] = fn().decode()
    return info


def _openblas_threads(lib: ctypes.CDLL, n: int) -> None:
    """The library's threads a call (the names NumPy's OpenBLAS builds give it)."""
    from euler.blas_kernels import SET_THREADS, symbol

    getattr(lib, symbol(lib, SET_THREADS))(ctypes.c_int(n))


def _blis() -> tuple[ctypes.CDLL, dict]:
    """The blis wheel's library (its extension modules export BLIS's C API) and what it
    reports: version and the architecture it chose for this CPU."""
    spec = importlib.util.find_spec("blis")
    if spec is None or not spec.submodule_search_locations:
        raise typer.BadParameter("blis: the `blis` package is not installed")
    path = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "cy*.so")))[0]
    lib = ctypes.CDLL(path)
    lib.bli_arch_string.restype = ctypes.c_char_p
    lib.bli_info_get_version_str.restype = ctypes.c_char_p
    arch = lib.bli_arch_string(lib.bli_arch_query_id()).decode()
    return lib, {"version": lib.bli_info_get_version_str().decode(), "arch": arch}


def _blis_mul(lib: ctypes.CDLL):
    """f(c, a, b, ta, tb) through bli_sgemm, transposes as swapped strides."""
    fn = lib.bli_sgemm
    fn.argtypes = [ctypes.c_int, ctypes.c_int, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64,
                   _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64]  # fmt: skip
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def mul(c, a, b, ta, tb):
        M, N = c.shape
        K = a.shape[0] if ta else a.shape[1]
        rsa, csa = (1, a.shape[1]) if ta else (a.shape[1], 1)
        rsb, csb = (1, b.shape[1]) if tb else (b.shape[1], 1)
        fn(0, 0, M, N, K, ctypes.byref(one), a.ctypes.data, rsa, csa, b.ctypes.data, rsb, csb,
           ctypes.byref(zero), c.ctypes.data, N, 1)  # fmt: skip

    return mul


def _torch_mul():
    import torch

    def mul(c, a, b, ta, tb):
        x, y = torch.from_numpy(a), torch.from_numpy(b)
        torch.matmul(x.T if ta else x, y.T if tb else y, out=torch.from_numpy(c))

    return mul, torch


def _child(library: str, preset: str, copies: int, threaded: bool, reps: int, path: str) -> dict:
    """GFLOP/s a core of every product of the preset's step with this library: `copies`
    copies at once, one a thread (or one call on `copies` threads of the library's own)."""
    out: dict = {"library": library, "preset": preset, "cores": copies,
                 "mode": "threaded" if threaded else "copies"}  # fmt: skip
    if library in ("numpy", "openblas"):
        lib, name = _openblas(path if library == "openblas" else "")
        out.update(_openblas_info(lib))
        _openblas_threads(lib, copies if threaded else 1)
        mul = _openblas_mul(lib, name)
    elif library.startswith("euler"):
        import numba
        from cpu_plans import parse_plan

        from euler.cpu.blas import Products, core_name

        numba.set_num_threads(copies)
        plan = parse_plan(library.partition(":")[2] or "default")
        mul, out["core"] = Products(plan), core_name()  # mul(out, a, b, trans_a, trans_b)
    elif library == "blis":
        lib, info = _blis()
        out.update(info)
        mul = _blis_mul(lib)
    else:
        mul, torch = _torch_mul()
        torch.set_num_threads(copies if threaded else 1)
        out["torch"] = torch.__version__
    calls = 1 if threaded else copies
    pool = ThreadPoolExecutor(calls)
    rng = np.random.default_rng(0)
    out["gflops"], flop, seconds = {}, 0, 0.0
    for weight, M, N, K, ta, tb in shapes(preset):
        a = rng.standard_normal((calls, K, M) if ta else (calls, M, K), np.float32)
        b = rng.standard_normal((calls, N, K) if tb else (calls, K, N), np.float32)
        c = np.empty((calls, M, N), np.float32)
        mul(c[0], a[0], b[0], ta, tb)
        want = (a[0].T if ta else a[0]) @ (b[0].T if tb else b[0])
        if not np.allclose(c[0], want, rtol=1e-3, atol=1e-2):
            raise SystemExit(f"{library}: {weight} {M}x{N}x{K} differs from NumPy's product")
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            list(pool.map(mul, c, a, b, [ta] * calls, [tb] * calls))
            best = min(best, time.perf_counter() - t0)
        name = f"{weight} {M}x{N}x{K} {'t' if ta else 'n'}{'t' if tb else 'n'}"
        out["gflops"][name] = round(2 * M * N * K * calls / best / 1e9 / copies, 1)
        flop, seconds = flop + 2 * M * N * K * calls, seconds + best
    out["gflops_all"] = round(flop / seconds / 1e9 / copies, 1)
    return out


def main(
    libraries: Annotated[
        str, typer.Option(help="Of numpy, openblas, blis, torch, euler.")
    ] = "numpy,blis,torch",
    preset: Annotated[str, typer.Option(help="Whose shapes: small or gpu.")] = "gpu",
    copies: Annotated[str, typer.Option(help="Core counts, each N copies at once.")] = "1",
    threaded: Annotated[bool, typer.Option(help="Also one call on N threads.")] = False,
    reps: Annotated[int, typer.Option(help="Rounds a shape; the best is kept.")] = 5,
    openblas: Annotated[str, typer.Option(help="The other OpenBLAS's library file.")] = "",
    child: Annotated[str, typer.Option(hidden=True)] = "",
) -> None:
    """One JSON line a library and core count: GFLOP/s a core of each of the step's products."""
    counts = [int(c) for c in copies.split(",")]
    if child:
        print(json.dumps(_child(child, preset, counts[0], threaded, reps, openblas)), flush=True)
        return
    mask = sorted(os.sched_getaffinity(0))
    for n in counts:
        if not 1 <= n <= len(mask):
            raise typer.BadParameter(f"--copies: 1 to {len(mask)} (this process's cores)")
        first = ",".join(str(c) for c in mask[:n])
        for library in libraries.split(","):
            if library.startswith("euler"):  # one product at a time on Numba's N threads
                modes = [True]
            elif library == "blis" or n == 1 or not threaded:
                modes = [False]
            else:
                modes = [False, True]
            for mode in modes:
                env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n),
                           MKL_NUM_THREADS=str(n), NUMBA_NUM_THREADS=str(n))  # fmt: skip
                cmd = ["taskset", "-c", first, sys.executable, __file__, "--preset", preset,
                       "--copies", str(n), "--reps", str(reps), "--openblas", openblas,
                       "--child", library, "--threaded" if mode else "--no-threaded"]  # fmt: skip
                subprocess.run(cmd, env=env, check=False)


if __name__ == "__main__":
    typer.run(main)
