"""Downloads against a local HTTP server on 127.0.0.1 (no internet): resume, checks, errors."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

import duckdb
import pytest

from euler.data.download import cache_name, download
from euler.data.sources import iter_documents, resolve_inputs
from euler.errors import EulerError

BODY = bytes(range(256)) * 1000  # 256,000 bytes
BOOK = (
    b"*** START OF THIS PROJECT GUTENBERG EBOOK SEVEN ***\r\nChapter one.\r\n"
    b"*** END OF THIS PROJECT GUTENBERG EBOOK SEVEN ***\r\nlicense\r\n"
)


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves BODY at /file with Range support; /norange ignores Range; /cut stops halfway."""

    requests: list[tuple[str, str | None]] = []
    files: dict[str, bytes] = {}  # more paths a test can serve

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        Handler.requests.append((self.path, rng))
        if self.path in Handler.files:
            self.send_response(200)
            self.send_header("Content-Length", str(len(Handler.files[self.path])))
            self.end_headers()
            self.wfile.write(Handler.files[self.path])
            return
        if self.path == "/boom":
            self.send_error(500, "Internal Server Error")
            return
        if self.path not in ("/file", "/norange", "/cut"):
            self.send_error(404, "Not Found")
            return
        start = 0
        if rng and self.path == "/file":
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(BODY):
                self.send_response(416)
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
        else:
            self.send_response(200)
        body = BODY[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/cut":  # promise the whole body, send half, hang up
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
    Handler.requests.clear()
    return tmp_path / "cache"


def test_full_download_then_cache_hit(server, cache):
    sha = hashlib.sha256(BODY).hexdigest()
    path = download(f"{server}/file", sha256=sha, size=len(BODY), progress=False)
    assert path.read_bytes() == BODY
    assert path.parent == cache / "downloads"
    again = download(f"{server}/file", sha256=sha, progress=False)
    assert again == path
    assert len(Handler.requests) == 1  # the second call was served from the cache


def test_resume_asks_only_for_the_rest(server, tmp_path):
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(BODY[:100_000])
    download(f"{server}/file", dest, sha256=hashlib.sha256(BODY).hexdigest(), progress=False)
    assert dest.read_bytes() == BODY
    assert Handler.requests == [("/file", "bytes=100000-")]
    assert not (tmp_path / "f.bin.part").exists()


def test_resume_of_a_complete_part_file(server, tmp_path):
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(BODY)  # finished but never renamed: server says 416
    download(f"{server}/file", dest, size=len(BODY), progress=False)
    assert dest.read_bytes() == BODY


def test_server_ignoring_range_restarts_the_file(server, tmp_path):
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"junk that must not stay in front")
    download(f"{server}/norange", dest, size=len(BODY), progress=False)
    assert dest.read_bytes() == BODY


def test_cut_connection_keeps_part_for_resume(server, tmp_path):
    dest = tmp_path / "f.bin"
    with pytest.raises(EulerError, match="resume"):
        download(f"{server}/cut", dest, progress=False)
    assert not dest.exists()
    part = tmp_path / "f.bin.part"
    assert 0 < part.stat().st_size < len(BODY)
    part.rename(tmp_path / "g.bin.part")  # resume the same bytes from the Range-capable URL
    download(f"{server}/file", tmp_path / "g.bin", size=len(BODY), progress=False)
    assert (tmp_path / "g.bin").read_bytes() == BODY


def test_bad_checksum_and_size_leave_nothing(server, tmp_path):
    dest = tmp_path / "f.bin"
    with pytest.raises(EulerError, match="SHA-256"):
        download(f"{server}/file", dest, sha256="0" * 64, progress=False)
    with pytest.raises(EulerError, match="expected 5"):
        download(f"{server}/file", dest, size=5, progress=False)
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()


@pytest.mark.parametrize(("path", "code"), [("/missing", "404"), ("/boom", "500")])
def test_http_errors_are_one_line(server, tmp_path, path, code):
    with pytest.raises(EulerError, match=f"HTTP {code}") as err:
        download(f"{server}{path}", tmp_path / "x", progress=False)
    assert "\n" not in str(err.value)
    assert not any(tmp_path.glob("x*"))


def test_unreachable_host_and_bad_scheme(tmp_path):
    with pytest.raises(EulerError, match="download http://127.0.0.1:9/"):
        download("http://127.0.0.1:9/nothing", tmp_path / "x", progress=False)
    with pytest.raises(EulerError, match="only http"):
        download("file:///etc/passwd", tmp_path / "x", progress=False)


def test_progress_bar_path(server, tmp_path):
    path = download(f"{server}/file", tmp_path / "p.bin", progress=True)
    assert Path(path).read_bytes() == BODY


def test_cache_names_differ_per_url():
    a = cache_name("https://a.example/x/data.parquet")
    b = cache_name("https://b.example/x/data.parquet")
    assert a != b and a.endswith("-data.parquet") and b.endswith("-data.parquet")


def test_gutenberg_ebook_number_tries_each_url_layout(server):
    Handler.files["/files/7/7-0.txt"] = BOOK  # only the second URL layout has ebook 7
    (book,) = resolve_inputs("books", ["7"], mirror=server, progress=False)
    assert list(iter_documents(book)) == ["Chapter one."]
    assert [p for p, _ in Handler.requests] == ["/cache/epub/7/pg7.txt", "/files/7/7-0.txt"]
    with pytest.raises(EulerError, match="ebook 8: no plain-text file found"):
        resolve_inputs("books", ["8"], mirror=server, progress=False)


def test_parquet_by_url_is_cached_then_read(server, tmp_path, cache):
    local = tmp_path / "src.parquet"
    duckdb.sql(f"COPY (SELECT 'web text ' || i AS text FROM range(3) t(i)) TO '{local}'")
    Handler.files["/sample/000_00000.parquet"] = local.read_bytes()
    (inp,) = resolve_inputs("web", [f"{server}/sample/000_00000.parquet"], progress=False)
    assert inp.format == "parquet" and inp.path.parent == cache / "downloads"
    assert list(iter_documents(inp)) == ["web text 0", "web text 1", "web text 2"]


def test_alpaca_by_url(server, tmp_path):
    from euler.tokenizer import Tokenizer

    from euler.data.sft import SFTDataset, prepare_sft

    records = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}!"} for i in range(20)]
    Handler.files["/alpaca.json"] = json.dumps(records).encode()
    (tmp_path / "s.txt").write_text(json.dumps(records))
    tok = Tokenizer.train([tmp_path / "s.txt"], 270)
    m = prepare_sft([f"{server}/alpaca.json"], tmp_path / "sft", tok, progress=False)
    assert m["records"] == 20 and m["inputs"][0]["origin"] == f"{server}/alpaca.json"
    assert sum(len(SFTDataset(tmp_path / "sft", s).starts) for s in ("train", "val")) == 20


def test_corrupt_cached_file_is_fetched_again(server, tmp_path):
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"a corrupt earlier copy")
    download(f"{server}/file", dest, sha256=hashlib.sha256(BODY).hexdigest(), progress=False)
    assert dest.read_bytes() == BODY


def test_sha256_in_the_url_fragment(server, tmp_path):
    good = f"{server}/file#sha256={hashlib.sha256(BODY).hexdigest()}"
    assert download(good, tmp_path / "a", progress=False).read_bytes() == BODY
    assert Handler.requests[-1] == ("/file", None)  # the fragment stays on our side
    with pytest.raises(EulerError, match="SHA-256"):
        download(f"{server}/file#sha256={'0' * 64}", tmp_path / "b", progress=False)
