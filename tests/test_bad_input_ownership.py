"""Every command that writes, against every kind of thing it could be pointed at: with
--overwrite it replaces only what it writes itself, never an input and never something
of another kind (euler.ownership); refused in one line, every file left as it was.

Each case runs over a copy of one scratch world (`{root}`) that holds one of every
output kind, a few inputs and a folder and a PNG of the user's; tests/bad_input.py
snapshots the whole tree before and after.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from euler.tokenizer import Tokenizer

from euler import ownership
from euler.interop.hf_export import export_hf
from euler.training.loop import train
from tests.bad_input import Case, assert_refused
from tests.train_helpers import build_data, run_cli, tiny_config

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder

WORLD: dict[str, Path] = {}


def png(software: str | None) -> bytes:
    """A 1x1 PNG, with a tEXt chunk Software: `software` if given."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    text = chunk(b"tEXt", b"Software\0" + software.encode()) if software else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
        + text
        + chunk(b"IDAT", zlib.compress(b"\0\0"))
        + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One of every kind: pre, sft (data folders), run, ck.safetensors, hf (export),
    tok.json, hf_tok.json, eval.json, bench.json, plot.png; and the user's text.txt,
    alpaca.json, notes/ and photo.png."""
    data = build_data(tmp_path_factory)
    w = tmp_path_factory.mktemp("world")
    shutil.copytree(data / "pre", w / "pre")
    shutil.copytree(data / "sft", w / "sft")
    shutil.copy(data / "alpaca.json", w / "alpaca.json")
    quick = dict(steps=2, ckpt_every=2, eval_every=2, eval_batches=1, sample_tokens=0)
    train(tiny_config(w / "run", w / "pre", **quick))
    shutil.copy(w / "run" / "checkpoint.safetensors", w / "ck.safetensors")
    export_hf(w / "run", w / "hf")
    tok = Tokenizer.load(w / "pre" / "tokenizer.json")
    tok.save(w / "tok.json")
    (w / "hf_tok.json").write_text(tok.to_hf_json())
    report = {"checkpoint": "x", "step": 2, "text": {}}
    (w / "eval.json").write_text(json.dumps({"report": "euler eval", **report}))
    (w / "bench.json").write_text(json.dumps({"report": "euler bench", "steps": {}}))
    (w / "plot.png").write_bytes(png(ownership.PLOT_SOFTWARE))
    (w / "photo.png").write_bytes(png("GIMP"))
    (w / "text.txt").write_text("The cat sat on the mat. " * 40)
    (w / "notes").mkdir()
    (w / "notes" / "todo.txt").write_text("mine\n")
    WORLD["root"] = w
    return w


def copy_world(root: Path) -> None:
    shutil.copytree(WORLD["root"], root, dirs_exist_ok=True)


# what each kind is in the world, and which targets are folders
KIND_OF = {
    "pre": ownership.PRETRAIN_DATA,
    "sft": ownership.SFT_DATA,
    "run": ownership.RUN,
    "hf": ownership.EXPORT,
    "ck.safetensors": ownership.CHECKPOINT,
    "tok.json": ownership.TOKENIZER,
    "hf_tok.json": ownership.HF_TOKENIZER,
    "eval.json": ownership.EVAL_REPORT,
    "bench.json": ownership.BENCH_REPORT,
    "plot.png": ownership.PLOT,
    "notes": None,
    "photo.png": None,
    "text.txt": None,
    "alpaca.json": None,
    # files that belong to a folder of a kind: never replaced, whatever their own kind
    "pre/tokenizer.json": ownership.TOKENIZER,
    "pre/manifest.json": None,
    "run/checkpoint.safetensors": ownership.CHECKPOINT,
    "run/tokenizer.json": ownership.TOKENIZER,
    "run/run.json": None,
    "hf/tokenizer.json": ownership.HF_TOKENIZER,
    "hf/model.safetensors": None,
}

# every writer: its kind, its arguments before the output flag, the output flag
WRITERS = {
    "prepare": (ownership.PRETRAIN_DATA,
                ("data", "prepare", "--books", "{root}/text.txt", "--vocab-size", "300"), "--out"),
    "prepare-sft": (ownership.SFT_DATA,
                    ("data", "prepare-sft", "{root}/alpaca.json", "--tokenizer", "{root}/tok.json"),
                    "--out"),
    "tokenizer": (ownership.TOKENIZER,
                  ("tokenizer", "train", "{root}/text.txt", "--vocab-size", "300"), "--out"),
    "tokenizer-hf": (ownership.HF_TOKENIZER,
                     ("tokenizer", "train", "{root}/text.txt", "--vocab-size", "300", "--out",
                      "{root}/new_tok.json"), "--hf"),
    "train": (ownership.RUN,
              ("train", "--preset", "tiny", "--data", "{root}/pre", "--steps", "1",
               "--batch-size", "2"), "--out"),
    "sft": (ownership.RUN,
            ("sft", "--checkpoint", "{root}/run", "--data", "{root}/sft", "--steps", "1",
             "--batch-size", "2"), "--out"),
    "eval": (ownership.EVAL_REPORT, ("eval", "--checkpoint", "{root}/run", "--text",
                                     "{root}/text.txt"), "--json"),
    "bench": (ownership.BENCH_REPORT, ("bench", "--preset", "tiny", "--steps", "1"), "--json"),
    "export": (ownership.EXPORT, ("export", "--checkpoint", "{root}/ck.safetensors"), "--out"),
    "import": (ownership.CHECKPOINT, ("import", "{root}/hf"), "--out"),
    "plot": (ownership.PLOT, ("plot", "--checkpoint", "{root}/run"), "--out"),
}  # fmt: skip

FOLDER_WRITERS = {"prepare", "prepare-sft", "train", "sft", "export"}

# targets a writer accepts with --overwrite, and why (they are not cases here)
ACCEPTED = {
    # a run goes beside other files in a folder that holds no run file: nothing is replaced
    "train": {"notes"},
    "sft": {"notes"},
    # import writes FOLDER/checkpoint.safetensors, a new file, into a folder of other files
    "import": {"notes"},
    # a plot is the one output replaced without --overwrite: plotting again updates it
    "plot": {"plot.png"},
}


def _target_cases() -> list[Case]:
    """Every writer against every target not of its kind, with --overwrite."""
    cases = []
    for name, (kind, args, flag) in WRITERS.items():
        for target, target_kind in KIND_OF.items():
            belongs = "/" in target
            if (target_kind is kind and not belongs) or target in ACCEPTED.get(name, ()):
                continue
            if name == "plot" and not target.endswith(".png"):
                continue  # plot refuses any other suffix first (a case of its own below)
            words = (flag, f"{{root}}/{target}")
            out = (flag, f"{{root}}/{target}", "--overwrite")
            if name == "plot":
                out = out[:2]
            cases.append(Case(f"{name}-over-{target}", (*args, *out), words, copy_world))
    return cases


def _same_kind_cases() -> list[Case]:
    """Each writer's own kind without --overwrite, and as an input of the same command."""
    own = {"prepare": "pre", "prepare-sft": "sft", "tokenizer": "tok.json",
           "tokenizer-hf": "hf_tok.json", "train": "run", "sft": "run", "eval": "eval.json",
           "bench": "bench.json", "export": "hf", "import": "ck.safetensors"}  # fmt: skip
    cases = [
        Case(f"{name}-own-kind-no-overwrite",
             (*WRITERS[name][1], WRITERS[name][2], f"{{root}}/{target}"),
             (WRITERS[name][2], f"{{root}}/{target}", "--overwrite"), copy_world)
        for name, target in own.items()
    ]  # fmt: skip
    inputs = [
        # (id, args, words): the output is, or holds, an input of the same command
        ("prepare-over-its-tokenizer-folder",
         ("data", "prepare", "--books", "{root}/text.txt", "--tokenizer", "{root}/pre",
          "--out", "{root}/pre", "--overwrite"), ("--out", "{root}/pre", "an input")),
        ("prepare-over-its-books",
         ("data", "prepare", "--books", "{root}/pre", "--vocab-size", "300",
          "--out", "{root}/pre", "--overwrite"), ("--out", "--books", "an input")),
        ("prepare-sft-over-its-tokenizer",
         ("data", "prepare-sft", "{root}/alpaca.json", "--tokenizer", "{root}/sft",
          "--out", "{root}/sft", "--overwrite"), ("--out", "{root}/sft", "an input")),
        ("tokenizer-over-its-input",
         ("tokenizer", "train", "{root}/tok.json", "--vocab-size", "300",
          "--out", "{root}/tok.json", "--overwrite"), ("--out", "{root}/tok.json", "an input")),
        ("tokenizer-text-over-itself",
         ("tokenizer", "train", "{root}/text.txt", "--vocab-size", "300",
          "--out", "{root}/text.txt", "--overwrite"), ("--out", "{root}/text.txt", "an input")),
        ("sft-over-its-from",
         ("sft", "--checkpoint", "{root}/run", "--data", "{root}/sft", "--out", "{root}/run",
          "--overwrite"), ("--out", "{root}/run", "--checkpoint", "an input")),
        ("train-over-its-data",
         ("train", "--preset", "tiny", "--data", "{root}/pre", "--out", "{root}",
          "--overwrite"), ("--out", "--data", "an input")),
        ("eval-over-its-instructions",
         ("eval", "--checkpoint", "{root}/run", "--instructions", "{root}/eval.json", "--json",
          "{root}/eval.json", "--overwrite"), ("--json", "--instructions", "an input")),
        ("import-over-its-source",
         ("import", "{root}/hf", "--out", "{root}/hf/model.safetensors", "--overwrite"),
         ("--out", "{root}/hf")),
    ]  # fmt: skip
    cases += [Case(i, a, w, copy_world) for i, a, w in inputs]
    return cases


CASES = _target_cases() + _same_kind_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(world, case, tmp_path, monkeypatch, capsys):
    assert_refused(monkeypatch, capsys, case, tmp_path / "case")


def test_every_writer_has_cases():
    """The table covers every command that writes (a new writer must join it)."""
    named = {c.id.split("-over-")[0].split("-own-")[0] for c in CASES}
    assert set(WRITERS) <= named


@pytest.mark.parametrize("target", sorted(KIND_OF))
def test_identify(world, target):
    """Each thing in the world is recognised as its kind (or as none of ours)."""
    assert ownership.identify(world / target).kind is KIND_OF[target]


def test_replaced_with_overwrite_when_own_kind(world, tmp_path, monkeypatch, capsys):
    """The rule lets a writer replace its own kind: a tokenizer over a tokenizer."""
    copy_world(tmp_path)
    before = (tmp_path / "tok.json").read_bytes()
    code, _, err = run_cli(monkeypatch, capsys, "tokenizer", "train", str(tmp_path / "text.txt"),
                           "--vocab-size", "270", "--out", str(tmp_path / "tok.json"),
                           "--overwrite", "--no-progress")  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "tok.json").read_bytes() != before
    assert ownership.identify(tmp_path / "tok.json").kind is ownership.TOKENIZER
