"""OpenBLAS's kernel family: euler picks the AVX-512 one before NumPy loads OpenBLAS, and
warns where AVX2 kernels run on an AVX-512 CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from euler.blas_kernels import AVX512, cpu_flags, family_to_set, kernel_warning

HAS_AVX512 = AVX512 <= cpu_flags()


def test_the_avx512_family_is_set_only_before_numpy_and_unless_the_user_chose():
    flags = AVX512 | {"avx2", "fma"}
    assert family_to_set(flags, {}, numpy_loaded=False) == "SKYLAKEX"
    assert family_to_set(flags, {"OPENBLAS_CORETYPE": "HASWELL"}, numpy_loaded=False) == ""
    assert family_to_set(flags, {}, numpy_loaded=True) == ""
    assert family_to_set(flags - {"avx512bw"}, {}, numpy_loaded=False) == ""
    assert family_to_set(frozenset(), {}, numpy_loaded=False) == ""


def test_a_warning_names_avx2_kernels_on_an_avx512_cpu():
    assert "OPENBLAS_CORETYPE=SKYLAKEX" in kernel_warning("Haswell", AVX512)
    assert "OPENBLAS_CORETYPE=Haswell keeps" in kernel_warning("Haswell", AVX512, "Haswell")
    assert kernel_warning("SkylakeX", AVX512) == ""
    assert kernel_warning("Haswell", frozenset({"avx2", "fma"})) == ""
    assert kernel_warning("", AVX512) == ""


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, check=True)  # fmt: skip


def test_importing_euler_first_sets_the_family_and_numpy_first_does_not():
    show = "import os; print(os.environ.get('OPENBLAS_CORETYPE', ''))"
    assert _run(f"import euler; {show}").stdout.strip() == ("SKYLAKEX" if HAS_AVX512 else "")
    assert _run(f"import numpy, euler; {show}").stdout.strip() == ""


@pytest.mark.skipif(not HAS_AVX512, reason="the warning is for AVX-512 CPUs")
def test_haswell_kernels_on_this_avx512_cpu_are_warned_of():
    out = _run("import euler.cpu.blas as b; print(b.core_name())", OPENBLAS_CORETYPE="HASWELL")
    assert out.stdout.strip() == "Haswell"
    assert "OPENBLAS_CORETYPE=HASWELL keeps OpenBLAS on its Haswell kernels" in out.stderr
    out = _run("import euler.cpu.blas as b; print(b.core_name())")
    assert out.stdout.strip() == "SkylakeX" and "Haswell" not in out.stderr


def test_the_cli_prints_a_warning_as_one_line(capsys):
    from euler.cli.main import _one_line_warning

    _one_line_warning(kernel_warning("Haswell", AVX512, "Haswell"), UserWarning, "f.py", 1)
    err = capsys.readouterr().err
    assert err.startswith("warning: OPENBLAS_CORETYPE=Haswell") and err.count("\n") == 1
