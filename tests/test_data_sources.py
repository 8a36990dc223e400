"""Web and book inputs: WikiExtractor parsing, parquet and jsonl through DuckDB, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

from euler.data.sources import InputFile, iter_documents, resolve_inputs
from euler.errors import EulerError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

WIKI = """<doc id="12" url="http://en.wikipedia.org/wiki?curid=12" title="Anarchism">
Anarchism

Anarchism is a political philosophy.
It has many schools.
</doc>
<doc id="25" url="http://en.wikipedia.org/wiki?curid=25" title="Stub">
Stub
</doc>
<doc id="39" url="http://en.wikipedia.org/wiki?curid=39" title="Albedo">
Albedo

Albedo is the reflectivity of a surface.
</doc>
"""


def docs_of(path: Path, kind: str = "web", column: str = "text") -> list[str]:
    return [d for f in resolve_inputs(kind, [str(path)]) for d in iter_documents(f, column)]


def test_wikiextractor_articles_without_title_only_stubs(tmp_path):
    (tmp_path / "AA").mkdir()
    (tmp_path / "AA" / "wiki_00").write_text(WIKI)
    docs = docs_of(tmp_path)
    assert docs == [
        "Anarchism\n\nAnarchism is a political philosophy.\nIt has many schools.",
        "Albedo\n\nAlbedo is the reflectivity of a surface.",
    ]


def test_jsonl_text_column_and_skips_empty(tmp_path):
    path = tmp_path / "web.jsonl"
    rows = [{"text": "first doc\r\nline", "id": 1}, {"text": "  "}, {"body": "x"}, {"text": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert docs_of(path) == ["first doc\nline", "b"]


def test_parquet_with_named_column(tmp_path):
    path = tmp_path / "fineweb.parquet"
    duckdb.sql(
        "COPY (SELECT 'doc number ' || i AS content, i AS id FROM range(5000) t(i)) "
        f"TO '{path}' (FORMAT parquet)"
    )
    docs = docs_of(path, column="content")
    assert len(docs) == 5000 and docs[0] == "doc number 0" and docs[-1] == "doc number 4999"


def test_missing_text_column_names_the_columns(tmp_path):
    path = tmp_path / "web.parquet"
    duckdb.sql(f"COPY (SELECT 'x' AS body, 1 AS id) TO '{path}' (FORMAT parquet)")
    with pytest.raises(EulerError, match=r"no text column 'text' \(columns: body, id\)"):
        docs_of(path)


def test_invalid_jsonl_reports_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n')
    with pytest.raises(EulerError, match=r"bad\.jsonl:3: invalid JSON"):
        docs_of(path)


def test_bad_inputs(tmp_path):
    with pytest.raises(EulerError, match="not found"):
        resolve_inputs("books", [str(tmp_path / "nope.txt")])
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(EulerError, match="unknown web file format"):
        resolve_inputs("web", [str(tmp_path / "notes.csv")])
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(EulerError, match="not UTF-8"):
        list(iter_documents(InputFile(tmp_path / "latin1.txt", "gutenberg", "x")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EulerError, match="no .txt files"):
        resolve_inputs("books", [str(tmp_path / "empty")])


@pytest.mark.skipif(not (SHARED / "web").is_dir(), reason="shared/data/web not present")
def test_shared_web_folder():
    wiki = sorted((SHARED / "web" / "enwiki_2015_wikiextractor").rglob("wiki_*"))
    n_docs = sum(p.read_text(encoding="utf-8").count("<doc ") for p in wiki)
    files = resolve_inputs("web", [str(SHARED / "web")])
    formats = {f.format for f in files}
    assert formats == {"wikiextractor", "jsonl"}
    docs = [d for f in files if f.format == "wikiextractor" for d in iter_documents(f)]
    assert 0.9 * n_docs < len(docs) <= n_docs
    assert not any("<doc" in d or "</doc>" in d for d in docs)
    c4 = [d for f in files if f.format == "jsonl" for d in iter_documents(f)]
    assert len(c4) == 300


def test_gzipped_json_lines_as_c4_ships_them(tmp_path):
    path = tmp_path / "c4-train.00000-of-01024.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"text": "gz one"}) + "\n" + json.dumps({"text": "gz two"}) + "\n")
    assert docs_of(path) == ["gz one", "gz two"]
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"text": "a"}\n{"text": \n')
    with pytest.raises(EulerError, match=r"bad\.jsonl\.gz:2: invalid JSON"):
        docs_of(bad)
