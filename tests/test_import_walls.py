"""The walls around decoding: euler/inference, the model's schedule and the graph replay
reach a device only through the Backend protocol (euler.backend.make_backend), and nothing
of training, so decoding needs neither a device's package nor the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EULER = Path(__file__).resolve().parent.parent / "euler"
WALLED = sorted(EULER.glob("inference/*.py")) + [
    EULER / "model/transformer.py",
    EULER / "graphs.py",
]
FORBIDDEN = ("euler.cpu", "euler.gpu", "euler.training")


def forbidden_imports(source: str) -> list[str]:
    """The modules (or module.name) that source imports from FORBIDDEN, lazy imports
    included; a relative import is resolved as if source lived in euler/inference."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from .x / from ..x: relative to euler.inference
                package = ["euler", "inference"][: 3 - node.level]
                base = ".".join([*package, base] if base else package)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    return found


@pytest.mark.parametrize("path", WALLED, ids=lambda p: str(p.relative_to(EULER)))
def test_decoding_imports_no_device_package_and_nothing_of_training(path):
    assert forbidden_imports(path.read_text()) == []


@pytest.mark.parametrize(
    "source, bad",
    [
        ("from euler.cpu.backend import CpuBackend", True),
        ("def f():\n    from euler.training.step_graph import StepGraphs", True),
        ("import euler.gpu.backend", True),
        ("from euler import training", True),
        ("from ..cpu import decode", True),
        ("from euler.backend import make_backend", False),
        ("from euler.graphs import StepGraphs", False),
        ("from euler.cpuinfo import x", False),
    ],
)
def test_the_wall_check_catches_what_it_forbids(source, bad):
    assert bool(forbidden_imports(source)) is bad
