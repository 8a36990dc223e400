"""Text sources for pretraining: where documents come from and how they are read.

Two kinds of named source, each a list of inputs:

- books: local `.txt` files or folders of them, ebook numbers (downloaded from
  Project Gutenberg), or URLs of plain-text files. One book is one document, with
  its Project Gutenberg header and footer stripped.
- web: local or downloaded `.parquet` files (e.g. FineWeb-Edu, https://huggingface.co/
  datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT/000_00000.parquet) and
  JSON Lines (`.jsonl`, `.jsonl.gz`, C4's `.json.gz`) with a text column, both read
  with DuckDB; and WikiExtractor output (`<doc ...>` ... `</doc>` blocks, one article
  per document). Folders are walked recursively.

URLs are downloaded into the cache (download.py; `#sha256=<hex>` at the end of a URL
is checked). Files are read as strict UTF-8; newlines are normalised to LF.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from euler.data.download import download
from euler.data.files import CHUNK
from euler.data.gutenberg import DEFAULT_MIRROR, book_urls, normalize_newlines, strip_gutenberg
from euler.errors import EulerError

KINDS = ("books", "web")
TEXT_FORMATS = ("gutenberg", "wikiextractor")  # read as strict UTF-8 text (read_text)
WIKI_DOC = re.compile(r"<doc\b[^>]*>\n?(.*?)</doc>", re.DOTALL)
ROWS_PER_FETCH = 2048  # DuckDB rows pulled per round trip
TEXT_TYPES = ("VARCHAR", "JSON")  # DuckDB column types a text column may have (JSON: mixed)


@dataclass(frozen=True)
class InputFile:
    """One local file of a source, its format and where it came from."""

    path: Path
    format: str  # "gutenberg", "wikiextractor", "jsonl" or "parquet"
    origin: str  # the path or URL as given

    def describe(self) -> dict:
        """Manifest entry: origin, local path, bytes and SHA-256. A text input that is not
        UTF-8 is refused here, before any work (the hash reads every byte anyway)."""
        return {
            "origin": self.origin,
            "path": str(self.path),
            "format": self.format,
            "bytes": self.path.stat().st_size,
            "sha256": _digest(self.path, text=self.format in TEXT_FORMATS),
        }


def _digest(path: Path, text: bool) -> str:
    """Hex SHA-256 of a file; with text, EulerError at its first byte that is not UTF-8."""
    h = hashlib.sha256()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if text:
                pending = len(utf8.getstate()[0])
                try:
                    utf8.decode(chunk)
                except UnicodeDecodeError as e:
                    raise EulerError(
                        f"{path}: not UTF-8 (byte {done - pending + e.start})"
                    ) from None
            done += len(chunk)
    if text:
        try:
            utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise EulerError(f"{path}: not UTF-8 (it ends inside a character)") from None
    return h.hexdigest()


def _is_url(item: str) -> bool:
    return item.startswith(("http://", "https://"))


def _web_format(path: Path) -> str:
    """Format of a web file from its suffix, else by sniffing a `<doc` start."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".ndjson", ".jsonl.gz", ".json.gz")):  # C4 ships .json.gz lines
        return "jsonl"
    with open(path, "rb") as f:
        if f.read(64).lstrip().startswith(b"<doc"):
            return "wikiextractor"
    raise EulerError(f"{path}: unknown web file format (expected .parquet, .jsonl or <doc> files)")


def _walk(folder: Path) -> list[Path]:
    """Files below `folder`, sorted, hidden ones skipped."""
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    if not files:
        raise EulerError(f"{folder}: folder has no files")
    return files


def resolve_inputs(
    kind: str, items: list[str], mirror: str = DEFAULT_MIRROR, progress: bool = True
) -> list[InputFile]:
    """Expand a source's items (paths, folders, URLs, ebook numbers) into local input files.

    Downloads land in the cache. Raises EulerError for a missing path or an unknown format.
    """
    if kind not in KINDS:
        raise EulerError(f"unknown source kind {kind!r} (expected one of {', '.join(KINDS)})")
    out: list[InputFile] = []
    for item in items:
        if kind == "books" and item.isdigit():
            out.append(InputFile(_download_book(int(item), mirror, progress), "gutenberg", item))
            continue
        if _is_url(item):
            path = download(item, progress=progress)
            fmt = "gutenberg" if kind == "books" else _web_format(path)
            out.append(InputFile(path, fmt, item))
            continue
        path = Path(item).expanduser()
        if not path.exists():
            raise EulerError(f"{kind} input not found: {item}")
        if kind == "books":
            files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
            if not files:
                raise EulerError(f"{path}: no .txt files in folder")
            out += [InputFile(f, "gutenberg", str(f)) for f in files]
        else:
            files = _walk(path) if path.is_dir() else [path]
            out += [InputFile(f, _web_format(f), str(f)) for f in files]
    return out


def _download_book(number: int, mirror: str, progress: bool) -> Path:
    """Download ebook `number`, trying each known URL layout; EulerError if none works."""
    errors = []
    for url in book_urls(number, mirror):
        try:
            return download(url, progress=progress)
        except EulerError as e:
            errors.append(str(e))
    raise EulerError(f"ebook {number}: no plain-text file found ({'; '.join(errors)})")


def read_text(path: Path) -> str:
    """A file's text as strict UTF-8 (BOM dropped), LF newlines; EulerError names bad bytes."""
    data = path.read_bytes()
    try:
        return normalize_newlines(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise EulerError(f"{path}: not UTF-8 (byte {e.start})") from None


def iter_documents(inp: InputFile, text_column: str = "text") -> Iterator[str]:
    """Yield the cleaned, non-empty documents of one input file."""
    if inp.format == "gutenberg":
        text = strip_gutenberg(read_text(inp.path))
        if text:
            yield text
    elif inp.format == "wikiextractor":
        for m in WIKI_DOC.finditer(read_text(inp.path)):
            text = m.group(1).strip()
            if "\n" in text:  # an article with only its title line has no body
                yield text
    elif inp.format in ("jsonl", "parquet"):
        yield from _iter_table(inp.path, inp.format, text_column)
    else:
        raise EulerError(f"{inp.path}: unknown input format {inp.format!r}")


def _raise_first_bad_line(path: Path) -> None:
    """Raise EulerError at the first line of a JSON Lines file that is not a JSON object.

    DuckDB's own message can name the line after the faulty one, so the exact line
    is found again with the json module; returns only if every line parses.
    """
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise EulerError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(value, dict):
                raise EulerError(f"{path}:{lineno}: expected a JSON object per line")


def _iter_table(path: Path, fmt: str, column: str) -> Iterator[str]:
    """Stream one text column of a parquet or JSON Lines file through DuckDB."""
    import duckdb

    reader = "read_parquet(?)" if fmt == "parquet" else "read_json(?, format='newline_delimited')"
    con = duckdb.connect()
    try:
        try:
            types = {
                row[0]: row[1]
                for row in con.execute(f"DESCRIBE SELECT * FROM {reader}", [str(path)]).fetchall()
            }
            columns = list(types)
            if column not in columns:
                raise EulerError(
                    f"{path}: no text column {column!r} (columns: {', '.join(columns)}); "
                    "choose one with --text-column"
                )
            if types[column] not in TEXT_TYPES:
                texts = [c for c, t in types.items() if t in TEXT_TYPES]
                raise EulerError(
                    f"{path}: column {column!r} holds {types[column]} values, not text; choose "
                    f"a text column with --text-column ({', '.join(texts) or 'it has none'})"
                )
            quoted = '"' + column.replace('"', '""') + '"'
            cur = con.execute(f"SELECT {quoted} FROM {reader}", [str(path)])
            while rows := cur.fetchmany(ROWS_PER_FETCH):
                for (value,) in rows:
                    if isinstance(value, str) and value.strip():
                        yield normalize_newlines(value).strip()
        except duckdb.Error as e:
            if fmt == "jsonl":
                _raise_first_bad_line(path)
            msg = str(e).splitlines()[0]
            raise EulerError(f"{path}: cannot read {fmt}: {msg}") from None
    finally:
        con.close()
