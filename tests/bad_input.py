"""The bad-input suites' one assertion: a command refused in one line, nothing touched.

A case is a command line run in this process (`euler ARGS`) over a folder of files the
case made; it must exit with status 2, print exactly one line on stderr that starts with
`error:` and contains every word the case names (the file, field or flag at fault), print
no traceback anywhere, and leave every file under the folder byte for byte as it was, with
no file added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.train_helpers import run_cli


@dataclass(frozen=True)
class Case:
    """One refused command: args may hold `{root}` (the case's folder) and `{data}`
    (a shared prepared-data folder, read-only); setup(root) writes the case's files."""

    id: str
    args: tuple[str, ...]
    words: tuple[str, ...]
    setup: Callable[[Path], None] | None = field(default=None, compare=False)


def snapshot(root: Path) -> dict[str, str]:
    """SHA-256 of every file under root, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_refused(monkeypatch, capsys, case: Case, root: Path, **subst: str) -> str:
    """Run the case under root; check exit 2, one `error:` line naming its words, no
    traceback, and root unchanged. Returns the error line."""
    root.mkdir(parents=True, exist_ok=True)
    if case.setup is not None:
        case.setup(root)
    args = [a.format(root=root, **subst) for a in case.args]
    before = snapshot(root)
    code, out, err = run_cli(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in out + err, err
    assert code == 2, f"exit {code}; stderr: {err}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    missing = [w.format(root=root, **subst) for w in case.words]
    missing = [w for w in missing if w not in lines[0]]
    assert not missing, f"{lines[0]!r} does not name {missing}"
    assert snapshot(root) == before, "the command changed files it was given"
    return lines[0]
