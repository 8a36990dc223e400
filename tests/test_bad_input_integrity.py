"""A data folder checked at every open: a tokenizer swapped for another of the same size,
a shard altered, data prepared again under a run: refused by train, sft, eval --text,
prepare-sft and --resume in one line naming the file, nothing touched; and one writer of
an output folder at a time (the lock beside it).

Each case runs over a copy of one scratch world (`{root}`): data folders `pre` and
`sft`, a pretraining run `run` whose run.json names `{root}/pre`, and the same corpus
prepared with another split seed (`pre2`) and another tokenizer of the same size
(`other_tok.json`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from euler.tokenizer import Tokenizer

from euler.data.corpus import CorpusSource
from euler.data.prepare import prepare_corpus
from euler.training.loop import train
from tests.bad_input import Case, assert_refused, snapshot
from tests.train_helpers import build_data, run_cli, sentences, tiny_config

WORLD: dict[str, Path] = {}
LOCKS: list[int] = []


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = build_data(tmp_path_factory)
    w = tmp_path_factory.mktemp("world")
    shutil.copytree(data / "pre", w / "pre")
    shutil.copytree(data / "sft", w / "sft")
    shutil.copy(data / "alpaca.json", w / "alpaca.json")
    quick = dict(steps=2, ckpt_every=2, eval_every=2, eval_batches=1, sample_tokens=0)
    train(tiny_config(w / "run", w / "pre", **quick))
    tok = Tokenizer.load(w / "pre" / "tokenizer.json")
    docs = sentences(120, seed=0)
    src = CorpusSource("books", lambda: iter(docs), [{"origin": "generated"}])
    prepare_corpus([src], w / "pre2", tokenizer=tok, val_fraction=0.2, seed=1)
    (w / "other.txt").write_text(" ".join(sentences(60, seed=7)).upper())
    other = Tokenizer.train([w / "other.txt"], tok.vocab_size)
    assert other.vocab_size == tok.vocab_size and other.sha256 != tok.sha256
    other.save(w / "other_tok.json")
    WORLD["root"] = w
    return w


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
    yield
    while LOCKS:
        os.close(LOCKS.pop())


def copy_of(*edits):
    """A setup: a copy of the world whose run names the copied data, then edits(root)."""

    def setup(root: Path) -> None:
        shutil.copytree(WORLD["root"], root, dirs_exist_ok=True)
        doc = json.loads((root / "run" / "run.json").read_text())
        doc["train"]["data"] = str(root / "pre")
        doc["data"]["folder"] = str(root / "pre")
        (root / "run" / "run.json").write_text(json.dumps(doc))
        for edit in edits:
            edit(root)

    return setup


def swap_tokenizer(folder: str):
    """An edit: FOLDER's tokenizer.json replaced by another tokenizer of the same size."""
    return lambda root: shutil.copy(root / "other_tok.json", root / folder / "tokenizer.json")


def reprepared(root: Path) -> None:
    """An edit: `pre` prepared again (another split seed), as if by the user."""
    shutil.rmtree(root / "pre")
    shutil.copytree(root / "pre2", root / "pre")


def shard_bytes(offset: int, data: bytes, split: str = "val"):
    """An edit: bytes written into the first `split` shard of `pre`."""

    def edit(root: Path) -> None:
        m = json.loads((root / "pre" / "manifest.json").read_text())
        path = root / "pre" / m["sources"][0]["shards"][split][0]
        with open(path, "r+b") as f:
            f.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
            f.write(data)

    return edit


def bad_ids_recorded(root: Path) -> None:
    """An edit: an id past the vocabulary written into the first val shard, and the
    manifest's checksums of it updated (so only the ids check can see it)."""
    from euler.data.checksums import file_entry

    shard_bytes(-4, b"\xff\xff")(root)
    path = root / "pre" / "manifest.json"
    m = json.loads(path.read_text())
    name = m["sources"][0]["shards"]["val"][0]
    m["files"][name] = file_entry(root / "pre" / name)
    path.write_text(json.dumps(m))


def remove_manifest_file(root: Path) -> None:
    (root / "pre" / "tokenizer.json").unlink()


def held(folder: str):
    """An edit: the lock beside output FOLDER held by another process."""

    def edit(root: Path) -> None:
        fd = os.open(root / f".lock-{folder}", os.O_RDWR | os.O_CREAT)
        os.write(fd, b"4242\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
        LOCKS.append(fd)

    return edit


TRAIN = ("train", "--preset", "tiny", "--data", "{root}/pre", "--out", "{root}/new",
         "--batch-size", "2", "--steps", "2")  # fmt: skip
SFT = ("sft", "--checkpoint", "{root}/run", "--data", "{root}/sft", "--out", "{root}/new",
       "--batch-size", "2", "--steps", "2")  # fmt: skip
EVAL = ("eval", "--checkpoint", "{root}/run", "--text", "{root}/pre")
RESUME = ("train", "--resume", "{root}/run", "--steps", "3")
PREP_SFT = ("data", "prepare-sft", "{root}/alpaca.json", "--tokenizer", "{root}/pre",
            "--out", "{root}/new", "--seq-len", "24")  # fmt: skip
PREP = ("data", "prepare", "--books", "{root}/other.txt", "--vocab-size", "270",
        "--out", "{root}/new")  # fmt: skip
EXPORT = ("export", "--checkpoint", "{root}/run", "--out", "{root}/new")
TOK = "{root}/pre/tokenizer.json"

CASES = [
    # the tokenizer, checked whole against the manifest at every open
    Case("train-swapped-tokenizer", TRAIN, (TOK, "manifest.json", "sha256"),
         copy_of(swap_tokenizer("pre"))),
    Case("sft-swapped-tokenizer", SFT, ("{root}/sft/tokenizer.json", "manifest.json"),
         copy_of(swap_tokenizer("sft"))),
    Case("eval-text-swapped-tokenizer", EVAL, (TOK, "manifest.json"),
         copy_of(swap_tokenizer("pre"))),
    Case("resume-swapped-tokenizer", RESUME, (TOK, "manifest.json"),
         copy_of(swap_tokenizer("pre"))),
    Case("prepare-sft-swapped-tokenizer", PREP_SFT, (TOK, "manifest.json"),
         copy_of(swap_tokenizer("pre"))),
    Case("train-tokenizer-missing", TRAIN, (TOK,), copy_of(remove_manifest_file)),
    # a resume continues only on the data it started on, and says what changed
    Case("resume-reprepared", RESUME, ("{root}/pre", "not the data", "changed"),
         copy_of(reprepared)),
    # shards: every open checks the manifest's size and sampled checksum; eval names them
    Case("eval-text-shard-altered", EVAL, ("{root}/pre/", ".bin", "checksum"),
         copy_of(shard_bytes(40, b"\xff\xff\xff\xff"))),
    Case("eval-text-shard-cut", EVAL, ("{root}/pre/", ".bin", "bytes"),
         copy_of(lambda r: _truncate(r, "val"))),
    Case("train-shard-altered", TRAIN, ("{root}/pre/", ".bin", "checksum"),
         copy_of(shard_bytes(40, b"\xff\xff\xff\xff", "train"))),
    Case("eval-text-bad-ids", EVAL, ("--text", "{root}/pre/", ".bin", "65535"),
         copy_of(bad_ids_recorded)),
    Case("train-shard-cut", TRAIN, ("{root}/pre/", ".bin", "bytes"),
         copy_of(lambda r: _truncate(r, "train"))),
    # one writer of an output folder at a time
    Case("prepare-locked", PREP, ("--out", "{root}/new", "4242"), copy_of(held("new"))),
    Case("prepare-sft-locked", PREP_SFT, ("--out", "{root}/new", "4242"),
         copy_of(held("new"))),
    Case("export-locked", EXPORT, ("--out", "{root}/new", "4242"), copy_of(held("new"))),
]  # fmt: skip


def _truncate(root: Path, split: str) -> None:
    m = json.loads((root / "pre" / "manifest.json").read_text())
    path = root / "pre" / m["sources"][0]["shards"][split][0]
    os.truncate(path, path.stat().st_size - 2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(world, case, tmp_path, monkeypatch, capsys):
    assert_refused(monkeypatch, capsys, case, tmp_path / "case")


def test_a_failed_start_leaves_the_folder_as_it_found_it(world, tmp_path, monkeypatch, capsys):
    """A fresh run that fails before its first checkpoint leaves no run.json (a rerun is
    not refused as 'already holds a run'); a refused start deletes nothing of the run
    already there."""
    from euler.training import loop

    def fail(*args, **kw):
        raise loop.EulerError("the first step failed")

    args = ["train", "--preset", "tiny", "--data", str(world / "pre"), "--out",
            str(tmp_path / "new"), "--batch-size", "2", "--steps", "1"]  # fmt: skip
    monkeypatch.setattr(loop, "_train", fail)
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "the first step failed" in err
    assert not (tmp_path / "new").exists()  # made by the start, removed with it
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    code, _, err = run_cli(monkeypatch, capsys, *args[:6], str(tmp_path / "mine"), *args[7:])
    assert code == 2 and "the first step failed" in err
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    # a run with run.json only (no checkpoint yet) is refused, and kept whole
    shutil.copytree(world / "run", tmp_path / "old")
    (tmp_path / "old" / "checkpoint.safetensors").unlink()
    before = snapshot(tmp_path / "old")
    code, _, err = run_cli(monkeypatch, capsys, *args[:6], str(tmp_path / "old"), *args[7:])
    assert code == 2 and "already holds" in err and snapshot(tmp_path / "old") == before
    monkeypatch.undo()
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
