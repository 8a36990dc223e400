"""Downloads over HTTP(S) into the cache: progress bar, resume, checksum, clear errors.

A download goes to `<name>.part` next to its final name. If a `.part` file is
already there (an interrupted run), the request asks for the rest with a Range
header and appends; a server that ignores Range (200 instead of 206) restarts the
file from byte 0. The finished file is checked against the expected size and
SHA-256 when given and only then renamed to its final name, so a file under its
final name is always complete. A file already in the cache is not fetched again
unless it fails the size or hash check.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from euler.cache import cache_root
from euler.data.files import CHUNK, sha256_file
from euler.errors import EulerError

TIMEOUT_S = 60
USER_AGENT = "nanoeuler-data/0.1 (+urllib)"


def downloads_dir() -> Path:
    """Where downloads are cached: <cache_root>/downloads."""
    return cache_root() / "downloads"


def cache_name(url: str) -> str:
    """A file name for `url`: the last path part, prefixed by a short hash of the full URL."""
    last = Path(urllib.parse.urlparse(url).path).name or "index"
    last = re.sub(r"[^A-Za-z0-9._-]", "_", last)
    return f"{hashlib.sha256(url.encode()).hexdigest()[:10]}-{last}"


def check_sha256(value: str, where: str) -> str:
    """A hex SHA-256 (64 digits, either case), else EulerError naming `where`."""
    if len(value) != 64 or any(c not in "0123456789abcdefABCDEF" for c in value):
        shown = value if len(value) <= 70 else value[:67] + "..."
        raise EulerError(f"{where} must be 64 hex digits (a SHA-256), got {shown!r}")
    return value


def _check(path: Path, url: str, size: int | None, sha256: str | None) -> None:
    """Raise EulerError (after deleting `path`) if it has the wrong size or hash."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        path.unlink()
        raise EulerError(f"download {url}: got {actual} bytes, expected {size}")
    if sha256 is not None:
        digest = sha256_file(path)
        if digest != sha256.lower():
            path.unlink()
            raise EulerError(f"download {url}: SHA-256 {digest} does not match expected {sha256}")


def download(
    url: str,
    dest: Path | None = None,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
) -> Path:
    """Fetch `url` to `dest` (default: the cache) and return the local path.

    sha256 / size: expected hex digest / byte count, checked when given; a URL may
    also carry its digest as a fragment, `...#sha256=<hex>` (never sent to the server).
    Raises EulerError on HTTP errors, network errors and failed checks.
    """
    url, fragment = urllib.parse.urldefrag(url)
    if fragment.startswith("sha256="):
        sha256 = sha256 or check_sha256(fragment.removeprefix("sha256="), f"{url}: #sha256=")
    if sha256 is not None:
        check_sha256(sha256, f"download {url}: sha256")
    scheme = urllib.parse.urlparse(url).scheme
    if scheme not in ("http", "https"):
        raise EulerError(f"download {url}: only http:// and https:// URLs are supported")
    dest = Path(dest) if dest is not None else downloads_dir() / cache_name(url)
    if dest.is_file():
        try:
            _check(dest, url, size, sha256)
            return dest
        except EulerError:
            pass  # _check removed the bad copy; fetch it again
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if size is not None and have > size:  # a stale partial file cannot be resumed
        part.unlink()
        have = 0

    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # asked past the end: the partial file is already whole
            os.replace(part, dest)
            _check(dest, url, size, sha256)
            return dest
        raise EulerError(f"download {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise EulerError(f"download {url}: {reason}") from None

    with response:
        if have and response.status != 206:  # Range ignored: the body is the whole file
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else size
        mode = "ab" if have else "wb"
        try:
            with open(part, mode) as f:
                _copy(response, f, have, total, dest.name, progress)
        except (urllib.error.URLError, OSError) as e:  # the .part file stays for a resume
            raise EulerError(f"download {url}: interrupted ({e}); run again to resume") from None
    got = part.stat().st_size
    if total is not None and got != total:
        raise EulerError(
            f"download {url}: connection closed after {got} of {total} bytes; run again to resume"
        )
    os.replace(part, dest)
    _check(dest, url, size, sha256)
    return dest


def _copy(response, f, done: int, total: int | None, label: str, progress: bool) -> None:
    """Stream the response body into `f`, showing a rich progress bar when asked."""
    if not progress:
        while chunk := response.read(CHUNK):
            f.write(chunk)
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(label, total=total, completed=done)
        while chunk := response.read(CHUNK):
            f.write(chunk)
            bar.update(task, advance=len(chunk))
