"""docs/kernels/ holds every generated attention kernel exactly as the generator writes it.

The fast attention kernels are generated source (euler/gpu/kernel_sources.py); committing
the text makes a change to a kernel visible in review. No GPU is needed: the sources are
strings. After an intended change, rewrite them with `euler kernels write docs/kernels`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

cuda = pytest.importorskip("numba.cuda")
if cuda.config.ENABLE_CUDASIM:
    pytest.skip("the device's sources, not the simulator's", allow_module_level=True)

from euler.gpu import kernel_sources  # noqa: E402

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "kernels"
REWRITE = "rewrite them with `euler kernels write docs/kernels` and review the diff"


def test_committed_kernels_are_what_the_generator_writes():
    modules = kernel_sources.all_attention_modules()
    assert len(modules) == 14  # tf32 at E = 8, 16, 32, 64; bf16 at 16, 32, 64
    committed = {p.name for p in FOLDER.glob("*.py")}
    assert committed == set(modules), f"docs/kernels/ differs in its files: {REWRITE}"
    changed = [n for n, text in modules.items() if (FOLDER / n).read_bytes() != text.encode()]
    assert not changed, f"generated kernels changed: {', '.join(changed)}; {REWRITE}"


def test_committed_kernels_compile_as_python():
    for path in sorted(FOLDER.glob("*.py")):
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def _euler(*args: str) -> subprocess.CompletedProcess:
    code = "from euler.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_show_prints_the_committed_file():
    run = _euler("kernels", "show", "attention", "--precision", "bf16", "--head-size", "64")
    assert run.returncode == 0, run.stderr
    forward = (FOLDER / "attention_bf16_e64_forward.py").read_text(encoding="utf-8")
    backward = (FOLDER / "attention_bf16_e64_backward.py").read_text(encoding="utf-8")
    assert run.stdout == forward + "\n" + backward


def test_show_prints_the_readable_file_at_fp32():
    """fp32's kernels are not generated: `show` prints their plain file, any head size."""
    run = _euler("kernels", "show", "attention", "--precision", "fp32", "--head-size", "40")
    assert run.returncode == 0, run.stderr
    plain = FOLDER.parent.parent / "euler" / "gpu" / "attention.py"
    assert run.stdout == plain.read_text(encoding="utf-8")
    assert not list(FOLDER.glob("attention_fp32_*"))


def test_show_refuses_what_is_not_generated():
    run = _euler("kernels", "show", "attention", "--precision", "bf16", "--head-size", "8")
    assert run.returncode == 2
    assert run.stderr == "error: --head-size: one of 16, 32, 64 at bf16, not 8\n"
    run = _euler("kernels", "show", "rmsnorm")
    assert run.returncode == 2 and run.stderr.startswith("error: layer: one of attention")


def test_write_replaces_only_generated_kernels(tmp_path, monkeypatch, capsys):
    """`kernels write` refreshes its own files and refuses, before writing anything, a
    folder where one of its names is someone else's file."""
    import sys

    from euler.cli.main import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["euler", "kernels", "write", *args])
        try:
            main()
        except SystemExit as e:
            return e.code, capsys.readouterr()
        return 0, capsys.readouterr()

    out = tmp_path / "k"
    code, _ = run(str(out))
    assert code == 0
    names = sorted(p.name for p in out.iterdir())
    assert names and run(str(out))[0] == 0  # its own files: refreshed
    mine = out / names[0]
    mine.write_text("my notes\n")
    (out / names[1]).unlink()
    code, captured = run(str(out))
    assert code == 2 and captured.err.startswith("error: ") and names[0] in captured.err
    assert mine.read_text() == "my notes\n"
    assert not (out / names[1]).exists()  # refused before anything was written
