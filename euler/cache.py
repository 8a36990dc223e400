"""Where NanoEuler keeps what it can rebuild: prepared corpora and compiled kernels."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

COMPILE_RECORD = "compile-seconds.json"  # in cache_root(): the last cold start's seconds


def cache_root() -> Path:
    """The user cache folder: $EULER_CACHE, $XDG_CACHE_HOME/nanoeuler or ~/.cache/nanoeuler."""
    if os.environ.get("EULER_CACHE"):
        return Path(os.environ["EULER_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "nanoeuler"


def source_digest() -> str:
    """A digest of every source file of the package (names, sizes, modification times)."""
    here = Path(__file__).resolve().parent
    roots = [here, here.parent / "tokenizer"]  # the tokenizer's own folder in an editable install
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
            st = path.stat()
            h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def use_private_numba_cache() -> None:
    """Point Numba's on-disk cache at a folder named by the package's source digest.

    Numba revalidates a cached kernel against its own file only, not against the helpers it
    inlines from other files (euler/layer_math.py): after an edit or an upgrade it would
    silently load stale machine code. A folder per source digest makes any change start
    clean. A NUMBA_CACHE_DIR set by the user wins. The folder ignores EULER_CACHE, so runs
    that keep their data apart (tests do) still share compiled kernels. Must run before the
    kernels are defined.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    import numba

    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    numba.config.CACHE_DIR = str(base / "nanoeuler" / "numba" / source_digest())


def kernels_compiled() -> bool:
    """Whether Numba's cache holds kernels compiled from this source (an index file of
    any): a run then loads them instead of compiling (one not yet compiled still compiles)."""
    import numba

    folder = Path(numba.config.CACHE_DIR)
    return folder.is_dir() and next(folder.rglob("*.nbi"), None) is not None


def last_compile_seconds() -> float | None:
    """The seconds the last cold start took to its first step (record_compile_seconds);
    None when none was recorded or the record is unreadable (a cache, not an input)."""
    try:
        value = json.loads((cache_root() / COMPILE_RECORD).read_text())["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def record_compile_seconds(seconds: float) -> None:
    """Keep a cold start's seconds for the next one's notice (atomically; a cache that
    cannot be written costs only the estimate)."""
    from euler.data.files import write_json_atomic
    from euler.errors import EulerError

    try:
        write_json_atomic(cache_root() / COMPILE_RECORD, {"seconds": seconds})
    except (OSError, EulerError):
        pass
