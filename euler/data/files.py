"""File helpers the data pipeline shares: atomic writes, SHA-256, the user cache folder.

Rule: nothing we write may look complete before it is. Every file is written to a
temporary name in the same folder and moved into place with os.replace, which is
atomic on POSIX and Windows, so an interrupted run leaves only a `.tmp-*` file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from euler.errors import EulerError

CHUNK = 1 << 20  # bytes read per step when hashing or copying


def _default_mode(directory: bool = False) -> int:
    """Permissions a plain open()/mkdir() would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def make_temp(folder: Path, name: str) -> tuple[int, str]:
    """mkstemp next to `name` in `folder`, with the umask's usual permissions (not 0600)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{name}.")
    os.chmod(tmp, _default_mode())
    return fd, tmp


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def atomic_open(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary file next to `path`; on success fsync it and move it onto `path`.

    On any exception the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as indented UTF-8 JSON, atomically."""
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Build a folder under a temporary name; on success swap it in place of `out`.

    `out` may not exist, may be empty, or may be an earlier preparation (it has a
    manifest.json); anything else is refused so that no user file is deleted. On an
    exception the temporary folder is removed and `out` is untouched.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EulerError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise EulerError(f"output folder {out} is not empty and holds no earlier preparation")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}."))
    os.chmod(tmp, _default_mode(directory=True))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".old-{out.name}."))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
