"""File helpers the data pipeline shares: atomic writes, SHA-256, the user cache folder.

Rule: nothing we write may look complete before it is. Every file is written to a
temporary name in the same folder and moved into place with os.replace, which is
atomic on POSIX and Windows, so an interrupted run leaves only a `.tmp-*` file.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from euler.errors import EulerError

CHUNK = 1 << 20  # bytes read per step when hashing or copying


def default_mode(directory: bool = False) -> int:
    """Permissions a plain open()/mkdir() would give under the current umask (for files
    made by mkstemp/mkdtemp, which are private)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def make_temp(folder: Path, name: str) -> tuple[int, str]:
    """mkstemp next to `name` in `folder`, with the umask's usual permissions (not 0600)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{name}.")
    os.chmod(tmp, default_mode())
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


def check_output(out: Path, overwrite: bool = False, reads: Iterable[Path] = ()) -> None:
    """Refuse an output folder that a preparation may not replace.

    `out` may be missing or empty; an earlier preparation (it has a manifest.json) only
    with `overwrite`, and then only if none of `reads` (the inputs and the tokenizer the
    preparation reads) lies inside it. A folder of other files is never replaced.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EulerError(f"--out {out}: exists and is not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / "manifest.json").is_file():
        raise EulerError(f"--out {out}: folder is not empty and holds no earlier preparation")
    if not overwrite:
        raise EulerError(
            f"--out {out}: holds an earlier preparation; pass --overwrite to replace it"
        )
    inside = out.resolve()
    for path in reads:
        p = Path(path).resolve()
        if p == inside or inside in p.parents:
            raise EulerError(
                f"--overwrite would delete {path}, an input of this preparation inside --out {out}"
            )


def clean_stale(out: Path) -> None:
    """Remove what a killed preparation into `out` left in its parent folder.

    `.tmp-NAME.PID.*` folders of processes no longer running go. An `.old-NAME.*` folder
    holds the earlier preparation while the new one is swapped in: if `out` is missing,
    the swap was cut short and the earlier preparation is moved back; otherwise it goes.
    """
    parent = out.parent
    if not parent.is_dir():
        return
    name = glob.escape(out.name)
    for tmp in parent.glob(f".tmp-{name}.*"):
        pid = tmp.name[len(f".tmp-{out.name}.") :].split(".")[0]
        if tmp.is_dir() and not (pid.isdigit() and _running(int(pid))):
            shutil.rmtree(tmp, ignore_errors=True)
    for old in parent.glob(f".old-{name}.*"):
        kept = old / out.name
        if kept.is_dir() and not out.exists():
            os.replace(kept, out)
        shutil.rmtree(old, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether process `pid` exists (on this machine)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else
        return True
    return True


@contextmanager
def staged_dir(out: Path, overwrite: bool = False, reads: Iterable[Path] = ()) -> Iterator[Path]:
    """Build a folder under a temporary name; on success swap it in place of `out`.

    `out` is checked by check_output first. On an exception the temporary folder is
    removed and `out` is untouched; an OSError (a full disk) becomes one EulerError naming
    the file. What an earlier killed run left is cleaned first (clean_stale).
    """
    out = Path(out)
    clean_stale(out)
    check_output(out, overwrite, reads)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}.{os.getpid()}."))
    os.chmod(tmp, default_mode(directory=True))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".old-{out.name}."))
            os.replace(out, old / out.name)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old / out.name, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        where = str(e.filename).replace(str(tmp), str(out)) if e.filename else str(out)
        raise EulerError(f"{where}: {e.strerror or e} ({out} is left as it was)") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
