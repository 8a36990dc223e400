"""What a new user sees in the first hour at the terminal: help text printed as written
(Rich markup escaped), `euler --version`, a script-clean `chat --prompt`."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from tests.train_helpers import run_cli


@pytest.mark.parametrize("args", [("--help",), ("serve", "--help")], ids=["euler", "serve"])
def test_help_shows_the_serve_extra_literally(args, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "pip install -e '.[serve]'" in out, out


def test_version_is_the_packages(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "--version")
    assert code == 0, err
    assert out.strip() == f"euler (nanoeuler) {version('nanoeuler')}"
