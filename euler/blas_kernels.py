"""Which kernels NumPy's OpenBLAS runs: the AVX-512 ones wherever the CPU has AVX-512.

OpenBLAS picks its kernel family once, when the library loads, from the CPU's model number
(a build knows the models of its day), unless OPENBLAS_CORETYPE names one. The lent
machine's image sets OPENBLAS_CORETYPE=Haswell on its Sapphire Rapids Xeon, and the AVX2
kernels cost much: one core computed the `small` step's products at 70 to 78 GFLOP/s with
them and at 114 to 116 with the SkylakeX family, and our whole step ran 1.39x faster with
SkylakeX (bench/labs/cpu_blas_cores.py, docs/cpu.md). So `import euler` sets
OPENBLAS_CORETYPE=SKYLAKEX where the CPU has AVX-512 (F, BW, DQ, VL; Linux lists a flag
only where the system saves its registers), unless the variable is set already or NumPy
has loaded OpenBLAS; a family the environment names is kept, and euler/cpu/blas.py warns
when AVX2 kernels run on an AVX-512 CPU.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from collections.abc import Mapping

from euler.errors import EulerError

AVX512 = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
AVX512_FAMILIES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})  # OpenBLAS's names
# NumPy's OpenBLAS names its symbols by build: scipy-openblas wheels (NumPy 2) prefix and
# suffix them, OpenBLAS's own 64-bit-integer builds suffix them; all take 64-bit integers
SGEMM = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")
DGEMM = ("scipy_cblas_dgemm64_", "cblas_dgemm64_")
SET_THREADS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_")
CORE_NAME = ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename")


def symbol(lib: ctypes.CDLL, names: tuple[str, ...]) -> str | None:
    """The first of names (one symbol's names across builds) that lib exports, or None."""
    return next((n for n in names if hasattr(lib, n)), None)


@functools.cache
def openblas() -> ctypes.CDLL:
    """NumPy's OpenBLAS (NumPy is imported, which loads it), found among the libraries this
    process has loaded."""
    import numpy  # noqa: F401

    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        maps = ""
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        lib = ctypes.CDLL(path)
        if symbol(lib, SGEMM):
            return lib
    raise EulerError("CPU backend: NumPy's OpenBLAS (with 64-bit integers) was not found; "
                     "install NumPy's wheel from PyPI")  # fmt: skip


def core_name() -> str:
    """The kernel family OpenBLAS chose for this CPU (SkylakeX, Haswell, ...), or ''."""
    lib = openblas()
    name = symbol(lib, CORE_NAME)
    if name is None:
        return ""
    fn = getattr(lib, name)
    fn.restype = ctypes.c_char_p
    return fn().decode()


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's first CPU (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def family_to_set(flags: frozenset[str], environ: Mapping[str, str], numpy_loaded: bool) -> str:
    """The OPENBLAS_CORETYPE to set: 'SKYLAKEX' on an AVX-512 CPU, '' where the user set
    one already, NumPy has loaded OpenBLAS (too late to choose) or the CPU lacks AVX-512."""
    if numpy_loaded or environ.get("OPENBLAS_CORETYPE") or not AVX512 <= flags:
        return ""
    return "SKYLAKEX"


def choose_openblas_kernels() -> None:
    """Set OPENBLAS_CORETYPE for OpenBLAS to read when NumPy loads it (see family_to_set)."""
    family = family_to_set(cpu_flags(), os.environ, "numpy" in sys.modules)
    if family:
        os.environ["OPENBLAS_CORETYPE"] = family


def kernel_warning(core: str, flags: frozenset[str], chosen: str = "") -> str:
    """A one-line warning where OpenBLAS runs a non-AVX-512 family (core, as OpenBLAS names
    it) on a CPU with AVX-512, else ''; chosen is the environment's OPENBLAS_CORETYPE."""
    if not core or core.lower() in AVX512_FAMILIES or not AVX512 <= flags:
        return ""
    cost = "a Sapphire Rapids Xeon's step ran 1.4x slower so"
    if chosen:
        return (f"OPENBLAS_CORETYPE={chosen} keeps OpenBLAS on its {core} kernels on this "
                f"AVX-512 CPU ({cost}): unset it, or set it to SKYLAKEX")  # fmt: skip
    return (f"OpenBLAS runs its {core} kernels on this AVX-512 CPU ({cost}): set "
            "OPENBLAS_CORETYPE=SKYLAKEX, or import euler before numpy")  # fmt: skip
