"""Strangers' data folders, manifests, shards, instruction files, tokenizers and flags of
`euler data ...`, `euler tokenizer ...`, `euler train` and `euler sft`: each refused in one
line naming the file, field or flag, and nothing the command was given is changed
(tests/bad_input.py). Then the behaviour that changed with it, on good input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.data.checksums import SAMPLE_BLOCKS, SAMPLE_BYTES, file_entry
from euler.data.loader import TokenLoader
from euler.data.manifest import write_manifest
from euler.data.sft import prepare_sft
from euler.data.shards import HEADER_SIZE, write_shard
from euler.model.config import get_preset
from euler.model.params import ParamLayout, init_params
from euler.training import checkpoint
from tests.bad_input import Case, assert_refused, snapshot
from tests.train_helpers import build_data, run_cli

SHARED: dict[str, Path] = {}  # build_data's folders and a checkpoint, set by the fixture
PRE_TRAIN = "books-train-000.bin"
BOOK = "*** START OF THE PROJECT GUTENBERG EBOOK T ***\nThe cat sat on the mat. " * 20


@pytest.fixture(scope="module", autouse=True)
def shared(tmp_path_factory):
    """The session's prepared folders (read-only) and a tiny checkpoint of their vocabulary."""
    root = build_data(tmp_path_factory)
    ckpt = tmp_path_factory.mktemp("ckpt") / "checkpoint.safetensors"
    tok = Tokenizer.load(root / "pre" / "tokenizer.json")
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=tok.vocab_size)
    params = init_params(ParamLayout(cfg), 0)
    checkpoint.save(ckpt, cfg, params, None, {"step": 0}, {"kind": "pretrain"}, tok.to_json())
    SHARED.update(data=root, ckpt=ckpt)
    return SHARED


# ---------------------------------------------------------------- fixture builders


def write(name: str, data: str | bytes) -> Callable[[Path], None]:
    """Setup: one file under root."""

    def setup(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        for s in setups:
            s(root)

    return setup


def copy(kind: str = "pre", edit: Callable[[Path], None] | None = None, name: str | None = None):
    """Setup: a copy of the shared `pre` or `sft` folder as root/NAME, then edit(folder)."""

    def setup(root: Path) -> None:
        folder = root / (name or kind)
        shutil.copytree(SHARED["data"] / kind, folder)
        if edit is not None:
            edit(folder)

    return setup


def manifest_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """edit(folder): change the parsed manifest and write it back."""

    def edit(folder: Path) -> None:
        path = folder / "manifest.json"
        m = json.loads(path.read_text())
        change(m)
        path.write_text(json.dumps(m))

    return edit


def manifest_text(text: str | bytes) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / "manifest.json").write_bytes(text.encode() if isinstance(text, str) else text)

    return edit


def flip(name: str, at: int) -> Callable[[Path], None]:
    """edit(folder): invert one byte of a file (at < 0: from the end)."""

    def edit(folder: Path) -> None:
        raw = bytearray((folder / name).read_bytes())
        raw[at] ^= 0xFF
        (folder / name).write_bytes(bytes(raw))

    return edit


def replace_array(name: str, change: Callable[[np.ndarray], np.ndarray], dtype) -> Callable:
    """edit(folder): rewrite a shard's array and its manifest checksum, so that only the
    content checks can catch the damage."""

    def edit(folder: Path) -> None:
        path = folder / name
        raw = path.read_bytes()
        values = change(np.frombuffer(raw[HEADER_SIZE:], dtype).copy())
        vocab = int.from_bytes(raw[12:16], "little")
        write_shard(path, values, vocab, dtype)
        rehash(folder, name)

    return edit


def rehash(folder: Path, name: str) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    m["files"][name] = file_entry(folder / name)
    path.write_text(json.dumps(m))


def set_id(at: int, value: int):
    def change(a: np.ndarray) -> np.ndarray:
        a[at] = value
        return a

    return change


def _shift(at: int, by: int):
    """change(a): a[at] moved by `by` (clamped at 0)."""

    def change(a: np.ndarray) -> np.ndarray:
        a[at] = max(int(a[at]) + by, 0)
        return a

    return change


def sft_long_context(root: Path) -> None:
    """An SFT folder prepared for a 48-token context, longer than the tiny model's 24."""
    tok = Tokenizer.load(SHARED["data"] / "pre" / "tokenizer.json")
    prepare_sft([str(SHARED["data"] / "alpaca.json")], root / "sft48", tok, context=48,
                val_fraction=0.2, progress=False)  # fmt: skip


def tokenizer_doc(change: Callable[[dict], None]) -> str:
    doc = json.loads((SHARED["data"] / "pre" / "tokenizer.json").read_text())
    change(doc)
    return json.dumps(doc)


def tok_file(change: Callable[[dict], None], name: str = "tok.json"):
    def setup(root: Path) -> None:
        (root / name).write_text(tokenizer_doc(change))

    return setup


BOOK_FILE = write("book.txt", BOOK)
PREP = ("data", "prepare", "--books", "{root}/book.txt", "--out", "{root}/out")
PREP_V = (*PREP, "--vocab-size", "300")
RECORDS = json.dumps([{"instruction": "Say hi.", "input": "", "output": "hi"}] * 8)
SFT = ("data", "prepare-sft", "{root}/a.json", "--tokenizer", "{data}/pre", "--out", "{root}/o")
TRAIN = ("train", "--preset", "tiny", "--out", "{out}", "--steps", "1")
SFT_RUN = ("sft", "--checkpoint", "{ckpt}", "--out", "{out}", "--steps", "1")


def _pop(*keys: str) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        d = m
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]

    return change


def _merges(pairs: list) -> Callable[[dict], None]:
    """A tokenizer document change: these merges, with the vocab_size that goes with them."""

    def change(doc: dict) -> None:
        doc.update(merges=pairs, vocab_size=260 + len(pairs))

    return change


def _set(value, *keys: str | int) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        d = m
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


def _numeric_parquet(path: Path) -> None:
    """A parquet file whose `text` column holds integers (written by DuckDB, as read)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"COPY (SELECT 1::BIGINT AS text, 'a page' AS body) TO '{path}' (FORMAT parquet)")
    con.close()


CASES = [
    # ------------------------------------------------ euler data prepare: flags
    Case("prepare-vocab-small", (*PREP, "--vocab-size", "100"), ("--vocab-size", "100"), BOOK_FILE),
    # one document: one of the splits is left empty, which no training could use
    Case("prepare-a-split-empty", (*PREP, "--tokenizer", "{data}/pre"), ("split", "1 document"),
         BOOK_FILE),  # fmt: skip
    Case("prepare-vocab-huge", (*PREP, "--vocab-size", "99999999"), ("--vocab-size",), BOOK_FILE),
    Case("prepare-val-one", (*PREP_V, "--val-fraction", "1"), ("--val-fraction", "[0, 1)"),
         BOOK_FILE),
    Case("prepare-val-negative", (*PREP_V, "--val-fraction", "-0.1"), ("--val-fraction",),
         BOOK_FILE),
    Case("prepare-val-nan", (*PREP_V, "--val-fraction", "nan"), ("--val-fraction", "nan"),
         BOOK_FILE),
    Case("prepare-books-weight-zero", (*PREP_V, "--books-weight", "0"), ("--books-weight",),
         BOOK_FILE),
    Case("prepare-web-weight-negative", (*PREP_V, "--web-weight", "-1"), ("--web-weight",),
         BOOK_FILE),
    Case("prepare-weight-inf", (*PREP_V, "--books-weight", "inf"), ("--books-weight", "inf"),
         BOOK_FILE),
    Case("prepare-threads-negative", (*PREP_V, "--threads", "-1"), ("--threads", "-1"),
         BOOK_FILE),
    Case("prepare-threads-text", (*PREP_V, "--threads", "two"), ("--threads",), BOOK_FILE),
    Case("prepare-sample-zero", (*PREP_V, "--tokenizer-sample-mb", "0"),
         ("--tokenizer-sample-mb",), BOOK_FILE),
    Case("prepare-sample-nan", (*PREP_V, "--tokenizer-sample-mb", "nan"),
         ("--tokenizer-sample-mb",), BOOK_FILE),
    Case("prepare-seed-negative", (*PREP_V, "--seed", "-1"), ("--seed",), BOOK_FILE),
    Case("prepare-seed-huge", (*PREP_V, "--seed", str(2**64)), ("--seed",), BOOK_FILE),
    Case("prepare-tokenizer-and-vocab", (*PREP_V, "--tokenizer", "{data}/pre"),
         ("--tokenizer", "--vocab-size"), BOOK_FILE),
    Case("prepare-no-input", ("data", "prepare", "--out", "{root}/o", "--vocab-size", "300"),
         ("--books",)),
    # ------------------------------------------------ euler data prepare: inputs and --out
    Case("prepare-missing-book", ("data", "prepare", "--books", "{root}/nope.txt", "--out",
         "{root}/o", "--vocab-size", "300"), ("nope.txt", "not found")),
    Case("prepare-binary-book", PREP_V, ("book.txt", "not UTF-8"),
         write("book.txt", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))),
    Case("prepare-web-unknown-format", ("data", "prepare", "--web", "{root}/w.csv", "--out",
         "{root}/o", "--vocab-size", "300"), ("w.csv", "unknown web file format"),
         write("w.csv", "text\nhello\n")),
    Case("prepare-web-bad-line", ("data", "prepare", "--web", "{root}/w.jsonl", "--out",
         "{root}/o", "--vocab-size", "300"), ("w.jsonl:2", "invalid JSON"),
         write("w.jsonl", '{"text": "a page"}\n{"text": \n')),
    Case("prepare-web-no-column", ("data", "prepare", "--web", "{root}/w.jsonl", "--out",
         "{root}/o", "--vocab-size", "300"), ("w.jsonl", "'text'"),
         write("w.jsonl", '{"body": "a page"}\n')),
    # an empty book or a column of numbers: named by the user's file and field, never by a
    # file of ours (the tokenizer's sample, the staging folder)
    Case("prepare-empty-book", ("data", "prepare", "--books", "{root}/e.txt", "--out",
         "{root}/o", "--vocab-size", "300"), ("e.txt", "books", "no document"),
         write("e.txt", "")),
    Case("prepare-empty-book-tokenizer", ("data", "prepare", "--books", "{root}/e.txt",
         "--out", "{root}/o", "--tokenizer", "{data}/pre"), ("e.txt", "books", "no document"),
         write("e.txt", "")),
    Case("prepare-header-only-book", ("data", "prepare", "--books", "{root}/h.txt", "--out",
         "{root}/o", "--vocab-size", "300"), ("h.txt", "header and footer"),
         write("h.txt", "*** START OF THE PROJECT GUTENBERG EBOOK T ***\n\n"
               "*** END OF THE PROJECT GUTENBERG EBOOK T ***\n")),
    Case("prepare-web-blank-texts", ("data", "prepare", "--web", "{root}/w.jsonl", "--out",
         "{root}/o", "--vocab-size", "300"), ("w.jsonl", "web", "no document"),
         write("w.jsonl", '{"text": ""}\n{"text": "  "}\n')),
    Case("prepare-web-numeric-column", ("data", "prepare", "--web", "{root}/w.jsonl", "--out",
         "{root}/o", "--vocab-size", "300"), ("w.jsonl", "'text'", "BIGINT", "--text-column"),
         write("w.jsonl", '{"text": 1, "body": "a page"}\n{"text": 2, "body": "b"}\n')),
    Case("prepare-web-numeric-column-tokenizer", ("data", "prepare", "--web", "{root}/w.jsonl",
         "--out", "{root}/o", "--tokenizer", "{data}/pre"), ("w.jsonl", "'text'", "body"),
         write("w.jsonl", '{"text": 1.5, "body": "a page"}\n')),
    Case("prepare-web-numeric-parquet", ("data", "prepare", "--web", "{root}/w.parquet",
         "--out", "{root}/o", "--vocab-size", "300"), ("w.parquet", "'text'", "--text-column"),
         lambda root: _numeric_parquet(root / "w.parquet")),
    Case("prepare-tokenizer-missing", (*PREP, "--tokenizer", "{root}/none.json"),
         ("--tokenizer", "none.json", "not found"), BOOK_FILE),
    Case("prepare-tokenizer-bad-merge", (*PREP, "--tokenizer", "{root}/tok.json"),
         ("tok.json", "merges[0]"),
         both(BOOK_FILE, tok_file(_merges([[0, 999], [1, 2]])))),
    Case("prepare-out-is-file", (*PREP_V[:4], "--out", "{root}/book.txt", *PREP_V[6:]),
         ("--out", "book.txt", "not a folder"), BOOK_FILE),
    Case("prepare-out-earlier-no-overwrite", PREP_V, ("--out", "--overwrite"),
         both(BOOK_FILE, copy("pre", name="out"))),
    Case("prepare-out-user-files", (*PREP_V, "--overwrite"), ("--out", "no euler command wrote"),
         both(BOOK_FILE, write("out/notes.txt", "mine"))),
    Case("prepare-overwrite-own-tokenizer", (*PREP, "--tokenizer", "{root}/out", "--overwrite"),
         ("--overwrite would delete", "tokenizer.json"), both(BOOK_FILE, copy("pre", name="out"))),
    Case("prepare-overwrite-own-input", ("data", "prepare", "--books", "{root}/out/b.txt",
         "--out", "{root}/out", "--vocab-size", "300", "--overwrite"),
         ("--overwrite would delete", "b.txt"), copy("pre", name="out",
         edit=lambda f: (f / "b.txt").write_text(BOOK))),
    # ------------------------------------------------ euler data prepare-sft
    Case("sft-context-one", (*SFT, "--seq-len", "1"), ("--seq-len", "1"), write("a.json", RECORDS)),
    Case("sft-context-huge", (*SFT, "--seq-len", str(1 << 40)), ("--seq-len",),
         write("a.json", RECORDS)),
    Case("sft-val-fraction", (*SFT, "--val-fraction", "1.5"), ("--val-fraction",),
         write("a.json", RECORDS)),
    Case("sft-seed", (*SFT, "--seed", "-3"), ("--seed",), write("a.json", RECORDS)),
    Case("sft-long-rule", (*SFT, "--long", "bogus"), ("--long", "cut, truncate, drop", "bogus"),
         write("a.json", RECORDS)),
    Case("sft-max-answer", (*SFT, "--max-answer", "-1"), ("--max-answer", "-1"),
         write("a.json", RECORDS)),
    Case("sft-invalid-json", SFT, ("a.json:1", "invalid JSON"), write("a.json", '[{"a": }]')),
    Case("sft-not-utf8", SFT, ("a.json", "not UTF-8"), write("a.json", b'["\xff\xfe"]')),
    Case("sft-not-a-list", SFT, ("a.json", "expected a JSON list"), write("a.json", "{}")),
    Case("sft-missing-output", SFT, ("a.json", "[0].output"),
         write("a.json", '[{"instruction": "x"}]')),
    Case("sft-output-number", SFT, ("a.json", "[1].output", "expected a string", "3"),
         write("a.json", '[{"instruction": "x", "output": "y"}, {"instruction": "x", '
               '"output": 3}]')),
    Case("sft-record-list", SFT, ("a.json", "[0]", "record object"), write("a.json", "[[1]]")),
    Case("sft-missing-file", SFT, ("a.json", "not found")),
    Case("sft-tokenizer-folder-without", ("data", "prepare-sft", "{root}/a.json", "--tokenizer",
         "{root}", "--out", "{root}/o"), ("--tokenizer", "tokenizer.json", "not found"),
         write("a.json", RECORDS)),
    Case("sft-tokenizer-not-utf8", ("data", "prepare-sft", "{root}/a.json", "--tokenizer",
         "{root}/t.json", "--out", "{root}/o"), ("t.json", "not UTF-8"),
         both(write("a.json", RECORDS), write("t.json", b"\xc3\x28"))),
    Case("sft-overwrite-own-tokenizer", ("data", "prepare-sft", "{root}/a.json", "--tokenizer",
         "{root}/o", "--out", "{root}/o", "--overwrite"), ("--overwrite would delete",),
         both(write("a.json", RECORDS), copy("pre", name="o"))),
    Case("sft-overwrite-own-input", ("data", "prepare-sft", "{root}/o/a.json", "--tokenizer",
         "{data}/pre", "--out", "{root}/o", "--overwrite"), ("--overwrite would delete", "a.json"),
         copy("sft", name="o", edit=lambda f: (f / "a.json").write_text(RECORDS))),
    Case("sft-out-earlier-no-overwrite", SFT, ("--out", "--overwrite"),
         both(write("a.json", RECORDS), copy("sft", name="o"))),
    Case("sft-nothing-fits", (*SFT, "--seq-len", "2"), ("no record fits", "2"),
         write("a.json", RECORDS)),
    # ------------------------------------------------ euler data info: manifests
    Case("info-missing-folder", ("data", "info", "{root}/nope"), ("data folder not found",)),
    Case("info-no-manifest", ("data", "info", "{root}"), ("no manifest.json",), BOOK_FILE),
    Case("info-invalid-json", ("data", "info", "{root}/pre"), ("manifest.json:1", "invalid JSON"),
         copy(edit=manifest_text("{"))),
    Case("info-not-utf8", ("data", "info", "{root}/pre"), ("manifest.json", "not UTF-8"),
         copy(edit=manifest_text(b'{"format": "\xff"}'))),
    Case("info-a-list", ("data", "info", "{root}/pre"), ("manifest.json", "a JSON object"),
         copy(edit=manifest_text("[1, 2]"))),
    Case("info-format", ("data", "info", "{root}/pre"), ("manifest.json", "format"),
         copy(edit=manifest_edit(_set("other", "format")))),
    Case("info-version-1", ("data", "info", "{root}/pre"), ("version", "re-run prepare"),
         copy(edit=manifest_edit(_set(1, "version")))),
    Case("info-version-string", ("data", "info", "{root}/pre"), ("version", "an integer", "'2'"),
         copy(edit=manifest_edit(_set("2", "version")))),
    Case("info-kind", ("data", "info", "{root}/pre"), ("kind", "'weird'"),
         copy(edit=manifest_edit(_set("weird", "kind")))),
    Case("info-tokenizer-list", ("data", "info", "{root}/pre"), ("tokenizer:", "a JSON object"),
         copy(edit=manifest_edit(_set([], "tokenizer")))),
    Case("info-vocab-string", ("data", "info", "{root}/pre"), ("tokenizer.vocab_size", "'300'"),
         copy(edit=manifest_edit(_set("300", "tokenizer", "vocab_size")))),
    Case("info-tokenizer-path", ("data", "info", "{root}/pre"), ("tokenizer.file", "plain file"),
         copy(edit=manifest_edit(_set("../../etc/passwd", "tokenizer", "file")))),
    Case("info-tokenizer-sha", ("data", "info", "{root}/pre"), ("tokenizer.sha256",),
         copy(edit=manifest_edit(_set("xyz", "tokenizer", "sha256")))),
    Case("info-eot-out-of-range", ("data", "info", "{root}/pre"), ("tokenizer.eot_id",),
         copy(edit=manifest_edit(_set(5000, "tokenizer", "eot_id")))),
    Case("info-sources-empty", ("data", "info", "{root}/pre"), ("sources",),
         copy(edit=manifest_edit(_set([], "sources")))),
    Case("info-source-not-object", ("data", "info", "{root}/pre"), ("sources[0]", "object"),
         copy(edit=manifest_edit(_set(3, "sources", 0)))),
    Case("info-weight-negative", ("data", "info", "{root}/pre"), ("sources[0].weight", "-1"),
         copy(edit=manifest_edit(_set(-1, "sources", 0, "weight")))),
    Case("info-shards-string", ("data", "info", "{root}/pre"), ("sources[0].shards.train",),
         copy(edit=manifest_edit(_set(PRE_TRAIN, "sources", 0, "shards", "train")))),
    Case("info-shard-unlisted", ("data", "info", "{root}/pre"), ("sources[0].shards.train[0]",
         "no entry in files"), copy(edit=manifest_edit(_pop("files", PRE_TRAIN)))),
    Case("info-tokens-float", ("data", "info", "{root}/pre"), ("sources[0].tokens.train", "1.5"),
         copy(edit=manifest_edit(_set(1.5, "sources", 0, "tokens", "train")))),
    Case("info-totals-missing", ("data", "info", "{root}/pre"), ("totals", "missing"),
         copy(edit=manifest_edit(_pop("totals")))),
    Case("info-threads-zero", ("data", "info", "{root}/pre"), ("totals.threads",),
         copy(edit=manifest_edit(_set(0, "totals", "threads")))),
    Case("info-files-sha-missing", ("data", "info", "{root}/pre"),
         (f"files.{PRE_TRAIN}.sha256", "missing"),
         copy(edit=manifest_edit(_pop("files", PRE_TRAIN, "sha256")))),
    Case("info-sft-context-string", ("data", "info", "{root}/sft"), ("context", "'24'"),
         copy("sft", manifest_edit(_set("24", "context")))),
    Case("info-sft-kept-negative", ("data", "info", "{root}/sft"), ("splits.train.kept",),
         copy("sft", manifest_edit(_set(-1, "splits", "train", "kept")))),
    Case("info-sft-files-missing", ("data", "info", "{root}/sft"), ("sft-train.mask.bin",),
         copy("sft", manifest_edit(_pop("files", "sft-train.mask.bin")))),
    # ------------------------------------------------ euler data verify
    Case("verify-flipped-byte", ("data", "verify", "{root}/pre"), (PRE_TRAIN, "SHA-256"),
         copy(edit=flip(PRE_TRAIN, -3))),
    Case("verify-truncated", ("data", "verify", "{root}/pre"), (PRE_TRAIN, "truncated"),
         copy(edit=lambda f: (f / PRE_TRAIN).write_bytes((f / PRE_TRAIN).read_bytes()[:-4]))),
    Case("verify-pickle", ("data", "verify", "{root}/pre"), (PRE_TRAIN, "not a NanoEuler shard"),
         copy(edit=lambda f: (f / PRE_TRAIN).write_bytes(b"\x80\x04\x95" + bytes(100)))),
    Case("verify-missing-shard", ("data", "verify", "{root}/pre"), (PRE_TRAIN, "missing"),
         copy(edit=lambda f: (f / PRE_TRAIN).unlink())),
    Case("verify-other-tokenizer", ("data", "verify", "{root}/pre"), ("tokenizer.json",),
         copy(edit=lambda f: (f / "tokenizer.json").write_text(Tokenizer([]).to_json()))),
    Case("verify-id-out-of-range", ("data", "verify", "{root}/pre"),
         (PRE_TRAIN, "position 7", "token id 65000"),
         copy(edit=replace_array(PRE_TRAIN, set_id(7, 65000), np.uint16))),
    Case("verify-sft-offsets", ("data", "verify", "{root}/sft"),
         ("sft-train.offsets.bin", "offsets"),
         copy("sft", replace_array("sft-train.offsets.bin", set_id(2, 1), np.uint64))),
    Case("verify-sft-mask-value", ("data", "verify", "{root}/sft"),
         ("sft-val.mask.bin", "position 3", "mask value 7"),
         copy("sft", replace_array("sft-val.mask.bin", set_id(3, 7), np.uint8))),
    Case("verify-sft-record-start-moved", ("data", "verify", "{root}/sft"),
         ("sft-train.records.bin", "window 1", "starts no record"),
         copy("sft", replace_array("sft-train.records.bin", _shift(1, 1), np.uint64))),
    Case("verify-sft-record-starts-fall", ("data", "verify", "{root}/sft"),
         ("sft-train.records.bin", "position 2", "must rise"),
         copy("sft", replace_array("sft-train.records.bin", _shift(2, -10**6), np.uint64))),
    Case("verify-sft-heldout-edited", ("data", "verify", "{root}/sft"),
         ("val-instructions.json", "SHA-256"),
         copy("sft", edit=lambda f: (f / "val-instructions.json").write_text("[]"))),
    Case("verify-not-a-folder", ("data", "verify", "{root}/none"), ("data folder not found",)),
    # ------------------------------------------------ euler data download (no network)
    Case("download-sha-short", ("data", "download", "https://example.invalid/x", "--sha256",
         "abc"), ("--sha256", "64 hex")),
    Case("download-size-negative", ("data", "download", "https://example.invalid/x", "--size",
         "-1"), ("--size", "-1")),
    Case("download-ftp", ("data", "download", "ftp://example.invalid/x", "--out", "{root}/x"),
         ("ftp://", "http")),
    Case("download-fragment-sha", ("data", "download", "https://example.invalid/x#sha256=zz",
         "--out", "{root}/x"), ("#sha256=", "64 hex")),
    # ------------------------------------------------ euler tokenizer
    Case("tok-train-vocab", ("tokenizer", "train", "{root}/book.txt", "--vocab-size", "10",
         "--out", "{root}/t.json"), ("--vocab-size", "10"), BOOK_FILE),
    Case("tok-train-binary", ("tokenizer", "train", "{root}/b.bin", "--vocab-size", "300",
         "--out", "{root}/t.json", "--no-progress"), ("b.bin", "not UTF-8"),
         write("b.bin", b"PK\x03\x04" + bytes(range(256)) * 4)),
    Case("tok-train-clobber", ("tokenizer", "train", "{root}/book.txt", "--vocab-size", "300",
         "--out", "{root}/t.json"), ("--out", "t.json", "--overwrite"),
         both(BOOK_FILE, write("t.json", "keep me"))),
    Case("tok-train-out-folder", ("tokenizer", "train", "{root}/book.txt", "--vocab-size", "300",
         "--out", "{root}/d", "--overwrite"), ("--out", "is a folder"),
         both(BOOK_FILE, write("d/x", "x"))),
    Case("tok-train-hf-same", ("tokenizer", "train", "{root}/book.txt", "--vocab-size", "300",
         "--out", "{root}/t.json", "--hf", "{root}/t.json"), ("--hf", "same file"), BOOK_FILE),
    Case("tok-encode-threads", ("tokenizer", "encode", "-t", "{data}/pre/tokenizer.json",
         "{root}/book.txt", "--threads", "0"), ("--threads", "0"), BOOK_FILE),
    Case("tok-encode-bad-merge", ("tokenizer", "encode", "-t", "{root}/tok.json",
         "{root}/book.txt"), ("tok.json", "merges[1]", "256"),
         both(BOOK_FILE, tok_file(_merges([[97, 98], [256, 97]])))),
    Case("tok-decode-range", ("tokenizer", "decode", "-t", "{data}/pre/tokenizer.json", "5",
         "300"), ("token id 2", "'300'", "[0, 299]")),
    Case("tok-decode-negative", ("tokenizer", "decode", "-t", "{data}/pre/tokenizer.json", "--",
         "-5"), ("token id 1", "'-5'")),
    Case("tok-decode-huge", ("tokenizer", "decode", "-t", "{data}/pre/tokenizer.json",
         "9" * 30), ("token id 1",)),
    Case("tok-stats-top", ("tokenizer", "stats", "-t", "{data}/pre/tokenizer.json",
         "{root}/book.txt", "--top", "-1"), ("--top", "-1"), BOOK_FILE),
    Case("tok-list", ("tokenizer", "decode", "-t", "{root}/tok.json", "1"),
         ("tok.json", "not a NanoEuler tokenizer"), write("tok.json", "[1, 2]")),
    Case("tok-vocab-mismatch", ("tokenizer", "decode", "-t", "{root}/tok.json", "1"),
         ("tok.json", "vocab_size"), tok_file(_set(301, "vocab_size"))),
    Case("tok-merges-dict", ("tokenizer", "decode", "-t", "{root}/tok.json", "1"),
         ("tok.json", "merges", "a list"), tok_file(_set({"a": 1}, "merges"))),
    Case("tok-version-string", ("tokenizer", "decode", "-t", "{root}/tok.json", "1"),
         ("tok.json", "version", "'1'"), tok_file(_set("1", "version"))),
    Case("tok-merge-bool", ("tokenizer", "decode", "-t", "{root}/tok.json", "1"),
         ("tok.json", "merges[0]"), tok_file(_merges([[True, 1]]))),
    # ------------------------------------------------ euler train / euler sft --data
    Case("train-manifest-vocab", (*TRAIN, "--data", "{root}/pre"), ("manifest.json",
         "tokenizer.vocab_size"), copy(edit=manifest_edit(_set("x", "tokenizer", "vocab_size")))),
    Case("train-flipped-byte", (*TRAIN, "--data", "{root}/pre"), (PRE_TRAIN, "contents differ"),
         copy(edit=flip(PRE_TRAIN, HEADER_SIZE + 1))),
    Case("train-shard-zip", (*TRAIN, "--data", "{root}/pre"), (PRE_TRAIN, "not a NanoEuler shard"),
         copy(edit=lambda f: (f / PRE_TRAIN).write_bytes(b"PK\x03\x04" + bytes(64)))),
    Case("train-sft-folder", (*TRAIN, "--data", "{root}/sft"), ("kind", "'sft'", "'pretrain'"),
         copy("sft")),
    Case("train-mask-as-shard", (*TRAIN, "--data", "{root}/pre"), (PRE_TRAIN, "element size 1"),
         copy(edit=lambda f: (write_shard(f / PRE_TRAIN, np.zeros(100), 300, np.uint8),
                              rehash(f, PRE_TRAIN)))),
    Case("sft-run-offsets", (*SFT_RUN, "--data", "{root}/sft"),
         ("sft-train.offsets.bin", "position 3"),
         copy("sft", replace_array("sft-train.offsets.bin", set_id(3, 2), np.uint64))),
    Case("sft-run-mask-length", (*SFT_RUN, "--data", "{root}/sft"),
         ("sft-train.mask.bin", "mask values for"),
         copy("sft", replace_array("sft-train.mask.bin", lambda a: a[:-1], np.uint8))),
    Case("sft-run-token-range", (*SFT_RUN, "--data", "{root}/sft"),
         ("sft-train.tokens.bin", "position 0", "token id 301"),
         copy("sft", replace_array("sft-train.tokens.bin", set_id(0, 301), np.uint16))),
    Case("sft-run-pretrain-folder", (*SFT_RUN, "--data", "{root}/pre"), ("kind", "'pretrain'"),
         copy("pre")),
    Case("sft-run-long-context", (*SFT_RUN, "--data", "{root}/sft48"),
         ("sft48", "context of 48", "context of 24"), sft_long_context),
]  # fmt: skip


def _subst(tmp_path: Path) -> dict[str, str]:
    return {"data": str(SHARED["data"]), "ckpt": str(SHARED["ckpt"]), "out": str(tmp_path / "run")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_in_one_line(case, tmp_path, monkeypatch, capsys):
    before = snapshot(SHARED["data"])
    line = assert_refused(monkeypatch, capsys, case, tmp_path / "root", **_subst(tmp_path))
    assert snapshot(SHARED["data"]) == before
    # a message names what the user gave, never a file of ours (a staging folder, a sample)
    assert ".tmp-" not in line and "tokenizer-sample.txt" not in line, line


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES) >= 60


# ---------------------------------------------------------------- the changed behaviour


def test_verify_passes_on_good_folders(monkeypatch, capsys):
    for kind in ("pre", "sft"):
        code, out, err = run_cli(monkeypatch, capsys, "data", "verify", str(SHARED["data"] / kind))
        assert code == 0 and "ok" in out and err == "", err


def test_overwrite_replaces_an_earlier_preparation(tmp_path, monkeypatch, capsys):
    shutil.copytree(SHARED["data"] / "sft", tmp_path / "o")
    (tmp_path / ".tmp-o.999999999.abc").mkdir()  # left by a killed run (no such process)
    (tmp_path / ".tmp-o.999999999.abc" / "sft-train.tokens.bin").write_bytes(b"partial")
    (tmp_path / "a.json").write_text(RECORDS)
    args = ("data", "prepare-sft", str(tmp_path / "a.json"), "--tokenizer",
            str(SHARED["data"] / "pre"), "--out", str(tmp_path / "o"))  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args, "--seq-len", "16", "--overwrite")
    assert code == 0, err
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["context"] == 16 and m["records"] == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "o"]
    code, _, _ = run_cli(monkeypatch, capsys, "data", "verify", str(tmp_path / "o"))
    assert code == 0


def test_an_interrupted_swap_gets_the_earlier_preparation_back(tmp_path, monkeypatch, capsys):
    (tmp_path / ".old-o.x1").mkdir()
    shutil.copytree(SHARED["data"] / "sft", tmp_path / ".old-o.x1" / "o")  # `o` itself is gone
    (tmp_path / "a.json").write_text(RECORDS)
    args = ("data", "prepare-sft", str(tmp_path / "a.json"), "--tokenizer",
            str(SHARED["data"] / "pre"), "--out", str(tmp_path / "o"))  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "--overwrite" in err  # the earlier preparation is back, kept
    assert snapshot(tmp_path / "o") == snapshot(SHARED["data"] / "sft")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "o"]


def test_a_full_disk_names_the_file_and_keeps_the_earlier_folder(tmp_path, monkeypatch, capsys):
    import errno
    import os

    from euler.data import shards

    shutil.copytree(SHARED["data"] / "sft", tmp_path / "o")
    before = snapshot(tmp_path / "o")
    (tmp_path / "a.json").write_text(RECORDS)

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    class FullDisk:  # the os module as the shard writer sees it, on a full disk
        def fdopen(self, fd, mode):
            return Full(os.fdopen(fd, mode))

        def __getattr__(self, name):
            return getattr(os, name)

    monkeypatch.setattr(shards, "os", FullDisk())
    args = ("data", "prepare-sft", str(tmp_path / "a.json"), "--tokenizer",
            str(SHARED["data"] / "pre"), "--out", str(tmp_path / "o"), "--overwrite")  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err and "sft-train.tokens.bin" in err
    assert str(tmp_path / "o") in err and "left as it was" in err
    assert snapshot(tmp_path / "o") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "o"]


def test_the_sampled_check_misses_what_verify_catches(tmp_path, monkeypatch, capsys):
    """A byte between sampled blocks passes the open (the documented trade-off)."""
    n = SAMPLE_BLOCKS * SAMPLE_BYTES  # tokens: twice the sampled bytes
    write_shard(tmp_path / "s.bin", np.arange(n) % 300, 300)
    shutil.copy(SHARED["data"] / "pre" / "tokenizer.json", tmp_path)
    sha = Tokenizer.load(tmp_path / "tokenizer.json").sha256
    tokenizer = {"file": "tokenizer.json", "sha256": sha, "vocab_size": 300, "eot_id": 256}
    per = {"train": 0, "val": 0}
    src = {"name": "s", "weight": None, "shards": {"train": ["s.bin"], "val": []},
           "documents": per, "tokens": per, "text_bytes": per}  # fmt: skip
    totals = {"tokens": per, "text_bytes": 0, "val_token_fraction": 0.0, "bytes_per_token": 1.0,
              "seconds": 0.0, "mb_per_s": None, "threads": 1}  # fmt: skip
    m = {"kind": "pretrain", "tokenizer": tokenizer, "sources": [src], "totals": totals}
    write_manifest(tmp_path, m, ["s.bin"])
    size = (tmp_path / "s.bin").stat().st_size
    gap = (size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)
    flip("s.bin", SAMPLE_BYTES + (gap - SAMPLE_BYTES) // 2)(tmp_path)  # between blocks 0 and 1
    assert TokenLoader(tmp_path).n_tokens == n
    code, _, err = run_cli(monkeypatch, capsys, "data", "verify", str(tmp_path))
    assert code == 2 and "s.bin: SHA-256" in err
