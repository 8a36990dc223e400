"""What each file or folder we write is, and the one rule for writing over one.

Every output says what it is, by a marker or its own header:

    run             a folder with run.json                       euler train / euler sft
    pretrain data   a folder whose manifest.json says pretrain   euler data prepare
    sft data        a folder whose manifest.json says sft        euler data prepare-sft
    export          a folder with an mtp_heads.safetensors side  euler export
                    file of format nanoeuler-mtp-heads
    checkpoint      a safetensors file of format nanoeuler       euler import (and runs)
    tokenizer       JSON with format nanoeuler-bpe               euler tokenizer train
    HF tokenizer    JSON with model and added_tokens             euler tokenizer train --hf
    eval report     JSON with "report": "euler eval"             euler eval --json
    bench report    JSON with "report": "euler bench"            euler bench --json
    COMMAND report  JSON with "report": "euler COMMAND"          euler COMMAND --json
                    (info, data prepare, tokenizer stats, ...: report_kind)
    loss plot       PNG with the text chunk Software: euler plot euler plot
    pipeline        a folder with pipeline.json whose report is  euler pipeline
                    "euler pipeline"

The rule (claim_folder, claim_file), checked before any work: a missing path (or an
empty folder) is free; an existing one is replaced only when it is of the kind the
command writes and --overwrite is given, and never when it is, or holds, an input of
the same command. Something of another kind, or of no kind we know, is never replaced
whatever the flag says, and a file that belongs to a folder of a kind (a data folder's
tokenizer.json, a run's checkpoint) is never replaced by a command that writes files.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from euler.errors import EulerError

LOCK_NAME = ".lock"  # a writer's lock file: not content of the folder
HEAD_BYTES = 1 << 16  # a PNG's text chunk lies within this many bytes of its start
MAX_JSON_BYTES = 512 << 20  # a JSON output larger than this is no report or tokenizer
MAX_ST_HEADER = 100 << 20  # a safetensors header longer than this is not a safetensors file
PLOT_SOFTWARE = "euler plot"  # the PNG text chunk euler plot writes


@dataclass(frozen=True)
class Kind:
    """A kind of output: its name in messages and the command that writes it."""

    name: str
    writer: str


RUN = Kind("training run", "euler train / euler sft")
PRETRAIN_DATA = Kind("pretraining data folder", "euler data prepare")
SFT_DATA = Kind("SFT data folder", "euler data prepare-sft")
EXPORT = Kind("Hugging Face export", "euler export")
CHECKPOINT = Kind("checkpoint", "euler import")
TOKENIZER = Kind("tokenizer", "euler tokenizer train")
HF_TOKENIZER = Kind("Hugging Face tokenizer", "euler tokenizer train --hf")
EVAL_REPORT = Kind("eval report", "euler eval --json")
BENCH_REPORT = Kind("bench report", "euler bench --json")
PLOT = Kind("loss plot", "euler plot")
PIPELINE = Kind("pipeline folder", "euler pipeline")

FOLDER_KINDS = (RUN, PRETRAIN_DATA, SFT_DATA, EXPORT, PIPELINE)


def report_kind(command: str) -> Kind:
    """The kind of the JSON that `euler COMMAND --json` writes (its "report" names it):
    EVAL_REPORT is report_kind("eval")."""
    return Kind(f"{command} report", f"euler {command} --json")


@dataclass(frozen=True)
class Found:
    """What a path holds: a kind of ours (or None), and those words for messages."""

    kind: Kind | None
    words: str


NOTHING = Found(None, "nothing")


def _article(name: str) -> str:
    return ("an " if name[0].lower() in "aeiou" and not name.startswith("eu") else "a ") + name


# ---------------------------------------------------------------------------- identifying


def identify(path: Path) -> Found:
    """What `path` is: NOTHING for a missing path or an empty folder (a lock file aside)."""
    path = Path(path)
    if path.is_dir():
        return _identify_folder(path)
    if not path.exists():
        return NOTHING
    return _identify_file(path)


def _identify_folder(folder: Path) -> Found:
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    if not names:
        return NOTHING
    if (folder / "run.json").is_file():
        return Found(RUN, _article(RUN.name))
    if (folder / "manifest.json").is_file():
        kind = _json_doc(folder / "manifest.json").get("kind")
        found = {"pretrain": PRETRAIN_DATA, "sft": SFT_DATA}.get(kind)
        if found is None:
            return Found(None, "a data folder whose manifest.json names no kind")
        return Found(found, _article(found.name))
    if _json_doc(folder / "pipeline.json").get("report") == "euler pipeline":
        return Found(PIPELINE, _article(PIPELINE.name))
    from euler.interop.hf_export import SIDE_FILE, SIDE_FORMAT

    if _safetensors_format(folder / SIDE_FILE) == SIDE_FORMAT:
        return Found(EXPORT, _article(EXPORT.name))
    return Found(None, f"a folder of files no euler command wrote ({names[0]}, ...)")


def _identify_file(path: Path) -> Found:
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        raise EulerError(f"{path}: cannot read ({e.strerror or e})") from None
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        if _png_software(head) == PLOT_SOFTWARE:
            return Found(PLOT, _article(PLOT.name))
        return Found(None, "a PNG image that euler plot did not write")
    fmt = _safetensors_format(path)
    if fmt is not None:
        from euler.training.checkpoint import FORMAT

        if fmt == FORMAT:
            return Found(CHECKPOINT, _article(CHECKPOINT.name))
        return Found(None, "a safetensors file")
    if head.lstrip()[:1] == b"{":
        return _identify_json(_json_doc(path))
    return Found(None, "a file no euler command wrote")


def _identify_json(doc: dict) -> Found:
    from euler.data.manifest import MANIFEST_FORMAT
    from euler.tokenizer.tokenizer import FORMAT

    report = doc.get("report")
    if doc.get("format") == FORMAT:
        return Found(TOKENIZER, _article(TOKENIZER.name))
    if isinstance(doc.get("model"), dict) and isinstance(doc.get("added_tokens"), list):
        return Found(HF_TOKENIZER, _article(HF_TOKENIZER.name))
    if report == "euler eval" or ({"checkpoint", "step"} <= doc.keys() and
                                  ("text" in doc or "instructions" in doc)):  # fmt: skip
        return Found(EVAL_REPORT, _article(EVAL_REPORT.name))
    if report == "euler bench" or {"meta", "peak", "step"} <= doc.keys():
        return Found(BENCH_REPORT, _article(BENCH_REPORT.name))
    if isinstance(report, str) and report.startswith("euler ") and report != "euler pipeline":
        kind = report_kind(report.removeprefix("euler "))
        return Found(kind, _article(kind.name))
    if doc.get("format") == MANIFEST_FORMAT:
        return Found(None, "a data folder's manifest")
    if {"run_id", "train", "model"} <= doc.keys():
        return Found(None, "a run's run.json")
    return Found(None, "a JSON file no euler command wrote")


def _json_doc(path: Path) -> dict:
    """The JSON object in `path`, or {} if it is none (too large, unreadable, not JSON)."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return {}
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _safetensors_format(path: Path) -> str | None:
    """The metadata `format` of a safetensors file ('' if it has none), None if `path` is
    not a safetensors file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if not 2 <= n <= MAX_ST_HEADER:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    meta = header.get("__metadata__")
    fmt = meta.get("format") if isinstance(meta, dict) else None
    return fmt if isinstance(fmt, str) else ""


def _png_software(head: bytes) -> str | None:
    """The value of a PNG's tEXt chunk `Software` among its first bytes, else None."""
    pos = 8
    while pos + 8 <= len(head):
        length, ctype = struct.unpack(">I4s", head[pos : pos + 8])
        body = head[pos + 8 : pos + 8 + length]
        if ctype == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            if key == b"Software":
                return value.decode("latin-1")
        if ctype in (b"IDAT", b"IEND"):
            return None
        pos += 12 + length
    return None


# ---------------------------------------------------------------------------- the rule


def _inside(path: Path, folder: Path) -> bool:
    p, f = Path(path).resolve(), Path(folder).resolve()
    return p == f or f in p.parents


def _input_clash(out: Path, reads: Iterable[tuple[str, Path]]) -> tuple[str, Path] | None:
    """The first input (flag, path) that is `out` or lies inside it."""
    for flag, path in reads:
        if path is not None and _inside(path, out):
            return flag, path
    return None


def check_writable(out: Path, flag: str = "--out", above: bool = True) -> None:
    """EulerError naming the flag and the user's path where this process may not write
    `out`: out itself when it is an existing folder, and (with above) the nearest existing
    folder above it (where a missing one, a lock or a staged copy would be made). Checked
    by the process's own rights (os.access): root passes, another user meets the mode bits."""
    out = Path(out)
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    places = ([parent] if above else []) + ([out] if out.is_dir() else [])
    for place in places:
        if place.is_dir() and not os.access(place, os.W_OK | os.X_OK):
            where = "it" if place == out else f"folder {place}"
            raise EulerError(f"{flag} {out}: cannot write in {where} ({os.strerror(errno.EACCES)})")


def claim_folder(
    out: Path,
    kind: Kind,
    overwrite: bool,
    reads: Iterable[tuple[str, Path]] = (),
    flag: str = "--out",
    foreign_ok: Iterable[str] | None = None,
) -> bool:
    """Check that `kind`'s command may write the folder `out`; True when it replaces an
    earlier one (then `overwrite` was given).

    reads: (flag, path) of every input of the command; none may be `out` or lie in it.
    foreign_ok: for a run, the names that make a folder of other files unusable (its
    own files); a folder of other files without them is written into, never cleared.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        found = identify(out)
        raise EulerError(f"{flag} {out}: is a file ({found.words}), not a folder")
    check_writable(out, flag)
    found = identify(out)
    if found is NOTHING:
        return False
    clash = _input_clash(out, reads)
    if clash is not None:
        raise EulerError(
            f"{flag} {out}: --overwrite would delete {clash[0]} {clash[1]}, an input of this "
            "command; choose another folder"
        )
    if found.kind is None and foreign_ok is not None:
        ours = sorted(n for n in foreign_ok if (out / n).exists())
        if not ours:
            return False  # other files only: written beside, never cleared
        raise EulerError(
            f"{flag} {out}: holds {ours[0]} but is not {_article(kind.name)} "
            f"({found.words}); {kind.writer} will not replace it: choose another folder"
        )
    if found.kind != kind:
        raise EulerError(
            f"{flag} {out}: holds {found.words}, not {_article(kind.name)}; {kind.writer} "
            "never replaces it, even with --overwrite: choose another folder"
        )
    if not overwrite:
        raise EulerError(
            f"{flag} {out}: already exists ({_article(kind.name)}); pass --overwrite to replace it"
        )
    return True


def claim_file(
    out: Path,
    kind: Kind,
    overwrite: bool,
    reads: Iterable[tuple[str, Path]] = (),
    flag: str = "--out",
) -> bool:
    """Check that `kind`'s command may write the file `out`; True when it replaces one.

    Refused: a folder, a missing parent folder, an input of the command, a file of a
    folder of a kind (a run's, a data folder's, an export's), a file of another kind;
    a file of this kind only with `overwrite`.
    """
    out = Path(out)
    if out.is_dir():
        raise EulerError(f"{flag} {out}: is a folder, expected a file name")
    if not out.parent.is_dir():
        raise EulerError(f"{flag} {out}: folder {out.parent} does not exist")
    check_writable(out, flag)
    if not out.exists():
        return False
    for in_flag, path in reads:
        if path is not None and Path(path).exists() and Path(path).resolve() == out.resolve():
            raise EulerError(
                f"{flag} {out}: --overwrite would delete {in_flag} {path}, an input of this "
                "command; choose another file"
            )
    owner = identify(out.parent).kind
    if owner in FOLDER_KINDS and _owned(owner, out):
        raise EulerError(
            f"{flag} {out}: belongs to {_article(owner.name)} ({out.parent}); "
            f"{kind.writer} never replaces it, even with --overwrite: choose another file"
        )
    found = identify(out)
    if found.kind != kind:
        raise EulerError(
            f"{flag} {out}: holds {found.words}, not {_article(kind.name)}; {kind.writer} "
            "never replaces it, even with --overwrite: choose another file"
        )
    if not overwrite:
        raise EulerError(
            f"{flag} {out}: already exists ({_article(kind.name)}); pass --overwrite to replace it"
        )
    return True


def _owned(owner: Kind, path: Path) -> bool:
    """Whether `path` is one of the files a folder of kind `owner` is made of."""
    if owner is RUN:
        from euler.training.run_folder import is_run_file

        return is_run_file(path.name)
    return True  # a data folder and an export are all theirs
