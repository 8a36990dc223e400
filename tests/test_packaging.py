"""Every package folder ships: pyproject.toml lists each one (a plain `pip install .` installs
only the listed packages; an editable install would hide a missing one)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup["package-dir"]  # package name -> folder, for the top-level mappings
    listed = set(setup["packages"])
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    missing = found - listed
    assert not missing, f"packages missing from pyproject.toml: {sorted(missing)}"
