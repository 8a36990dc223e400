"""File helpers the data pipeline shares: atomic writes, SHA-256, the user cache folder.

Rule: nothing we write may look complete before it is. Every file is written to a
temporary name in the same folder and moved into place with os.replace, which is
atomic on POSIX and Windows, so an interrupted run leaves only a `.tmp-*` file.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
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


def check_output(out: Path, overwrite: bool = False, reads: Iterable = (), kind=None) -> None:
    """Refuse an output folder that a preparation may not replace (euler.ownership's rule).

    `out` may be missing or empty; an earlier preparation of the same kind (pretraining
    data unless `kind` says otherwise) only with `overwrite`, and then only if none of
    `reads` (the inputs and the tokenizer the preparation reads: paths, or (flag, path))
    lies inside it. A folder of another kind or of other files is never replaced.
    """
    from euler import ownership

    reads = [r if isinstance(r, tuple) else ("input", Path(r)) for r in reads]
    ownership.claim_folder(Path(out), kind or ownership.PRETRAIN_DATA, overwrite, reads)


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


def acquire_lock(path: Path, busy: str) -> int:
    """Take the lock file `path` (flock, not waiting) and write our PID in it; a held one
    is refused as `busy` (the holder's PID appended). Returns the open file's descriptor;
    release_lock lets it go."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _lock_holder(fd)
            os.close(fd)
            raise EulerError(f"{busy} (PID {pid})") from None
        # a holder unlinks the file before it lets go: the file we locked may no longer be
        # the one at `path`, and another process may lock that one; then start over
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def lock_holder(path: Path) -> str | None:
    """The PID (as acquire_lock's message gives it) of the process holding the lock file
    `path`, or None when no process holds it; never creates the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file: nobody holds it (a holder unlinks it before letting go)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _lock_holder(fd)
    finally:
        os.close(fd)  # closing lets go of the shared lock when it was free
    return None


def release_lock(path: Path, fd: int) -> None:
    """Let go of a lock acquire_lock took: unlink the file while still holding it."""
    Path(path).unlink(missing_ok=True)
    os.close(fd)


def _lock_holder(fd: int) -> str:
    """The PID a held lock file names; its holder may not have written it yet."""
    for _ in range(20):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
        time.sleep(0.01)
    return "unknown"


@contextmanager
def output_lock(out: Path, flag: str = "--out") -> Iterator[None]:
    """Hold `.lock-NAME` beside the output folder `out` for the block: one writer of a
    folder at a time (a second one is refused, naming the first's PID)."""
    out = Path(out)
    if not out.parent.is_dir():
        raise EulerError(f"{flag} {out}: folder {out.parent} does not exist")
    from euler.ownership import check_writable

    check_writable(out, flag)  # the user's path named, never the lock's
    path = out.parent / f".lock-{out.name}"
    fd = acquire_lock(path, f"{flag} {out}: another process is writing it")
    try:
        yield
    finally:
        release_lock(path, fd)


@contextmanager
def staged_dir(
    out: Path, overwrite: bool = False, reads: Iterable = (), kind=None
) -> Iterator[Path]:
    """Build a folder under a temporary name; on success swap it in place of `out`.

    Holds output_lock for the block; `out` is checked by check_output under it. On an
    exception the temporary folder is removed and `out` is untouched; an OSError (a full
    disk) becomes one EulerError naming the file. What an earlier killed run left is
    cleaned first (clean_stale).
    """
    from euler.ownership import check_writable

    out = Path(out)
    check_writable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        clean_stale(out)
        check_output(out, overwrite, reads, kind)
        with _staged(out) as work:
            yield work


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
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
