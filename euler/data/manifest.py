"""The manifest JSON that sits next to a folder of shards and says what they hold.

Written last (atomically) by `prepare`, so a folder with a manifest is a complete
preparation. Keys: format, version, kind ("pretrain" or "sft"), tokenizer (file,
sha256, vocab_size, eot_id), files (every data file's bytes, sha256 and sample_sha256:
checksums.py), then per kind:

- pretrain: split (val_fraction, seed, rule), sources (one entry per named source with
  its inputs and checksums, weight, documents, tokens, text_bytes and shard files per
  split), totals and timing;
- sft: context, policy (long, pack, max_answer), too_long_rule (the policy in words),
  split, inputs, records, heldout (file, records, sha256), splits (per split statistics:
  records, whole, cut, truncated, dropped, kept, windows, tokens, loss shares).

`read_manifest` checks every field that any reader of the folder uses, so that code can
index the returned dict freely; a bad field is one line naming the file and the field.
Manifests of version 1 (no checksums) are refused with a request to prepare again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from euler.data.checksums import file_entry
from euler.data.files import write_json_atomic
from euler.data.sft_policy import LONG_RULES
from euler.errors import EulerError
from euler.schema import MISSING, Fields, read_json
from euler.tokenizer import FIRST_MERGE_ID, MAX_VOCAB_SIZE

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "nanoeuler-shards"
MANIFEST_VERSION = 2
KINDS = ("pretrain", "sft")
SPLITS = ("train", "val")
MAX_CONTEXT = 1 << 20  # tokens; far beyond any preset, so a larger one is corruption
SFT_FILES = ("tokens", "mask", "offsets", "records")


def sft_file(split: str, what: str) -> str:
    """Name of an SFT folder's `what` shard (one of SFT_FILES) of a split."""
    return f"sft-{split}.{what}.bin"


def write_manifest(folder: Path, manifest: dict, files: Iterable[str]) -> Path:
    """Write folder/manifest.json: format/version, `manifest`, and the checksums of the
    named data files of the folder."""
    folder = Path(folder)
    entries = {name: file_entry(folder / name) for name in files}
    path = folder / MANIFEST_NAME
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **manifest, "files": entries}
    write_json_atomic(path, doc)
    return path


def read_manifest(folder: Path, kind: str | None = None) -> dict:
    """Read folder/manifest.json with every field checked (and, if given, its kind)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise EulerError(f"data folder not found: {folder}")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise EulerError(f"{folder}: no {MANIFEST_NAME} (not a prepared data folder?)")
    doc = read_json(path, "data manifest")
    m = Fields(doc, str(path))
    if m.data.get("format") != MANIFEST_FORMAT:
        m.fail("format", repr(MANIFEST_FORMAT), m.data.get("format", MISSING))
    version = m.int("version")
    if version != MANIFEST_VERSION:
        older = " (written without shard checksums; re-run prepare)" if version == 1 else ""
        m.fail("version", f"{MANIFEST_VERSION}{older}", version)
    got = m.str("kind", KINDS)
    if kind is not None and got != kind:
        raise EulerError(f"{path}: kind: holds {got!r} data, expected {kind!r}")
    tok = _obj(m, "tokenizer")
    _file_name(tok, "file")
    _hex64(tok, "sha256")
    vocab = tok.int("vocab_size", lo=FIRST_MERGE_ID, hi=MAX_VOCAB_SIZE)
    tok.int("eot_id", lo=0, hi=vocab - 1)
    files = _obj(m, "files")
    for name in files.data:
        _check_name(files, name, name)
        entry = _obj(files, name)
        entry.int("bytes", lo=0)
        _hex64(entry, "sha256")
        _hex64(entry, "sample_sha256")
    if got == "pretrain":
        _check_pretrain(m, files)
    else:
        _check_sft(m, files)
    return doc


def _check_pretrain(m: Fields, files: Fields) -> None:
    """sources (names, weights, shards listed in files, counts) and totals."""
    sources = _objects(m, "sources")
    if not sources:
        m.fail("sources", "a list of at least one source", m.data["sources"])
    for src in sources:
        src.str("name")
        if src.get("weight") is not None and not src.float("weight") > 0:
            src.fail("weight", "a positive number or null", src.data["weight"])
        shards = _obj(src, "shards")
        for split in SPLITS:
            for i, name in enumerate(shards.list(split)):
                _check_name(shards, f"{split}[{i}]", name)
                if name not in files.data:
                    raise EulerError(
                        f"{m.where}: {shards.name(split)}[{i}]: shard {name!r} has no "
                        "entry in files (no checksum)"
                    )
        for key in ("documents", "tokens", "text_bytes"):
            _per_split(src, key)
    weighted = [src.data["weight"] is not None for src in sources]
    if any(weighted) and not all(weighted):
        raise EulerError(f"{m.where}: sources: a weight on some sources and null on others")
    totals = _obj(m, "totals")
    _per_split(totals, "tokens")
    totals.int("text_bytes", lo=0)
    totals.float("val_token_fraction", lo=0.0, hi=1.0)
    totals.float("bytes_per_token", lo=0.0)
    totals.float("seconds", lo=0.0)
    if totals.get("mb_per_s") is not None:
        totals.float("mb_per_s", lo=0.0)
    totals.int("threads", lo=1)


def _check_sft(m: Fields, files: Fields) -> None:
    """context, the policy, the per-split statistics, and the four shards of each split."""
    m.int("context", lo=1, hi=MAX_CONTEXT)
    if "policy" not in m.data:
        raise EulerError(
            f"{m.where}: no policy: prepared by an older `euler data prepare-sft` (one record a "
            "window); prepare it again"
        )
    policy = _obj(m, "policy")
    policy.str("long", choices=LONG_RULES)
    policy.bool("pack")
    policy.int("max_answer", lo=0)
    m.str("too_long_rule")
    m.int("records", lo=0)
    heldout = _obj(m, "heldout")
    _file_name(heldout, "file")
    heldout.int("records", lo=0)
    _hex64(heldout, "sha256")
    splits = _obj(m, "splits")
    for split in SPLITS:
        st = _obj(splits, split)
        for key in ("records", "whole", "cut", "truncated", "dropped", "kept", "windows",
                    "tokens", "loss_tokens"):  # fmt: skip
            st.int(key, lo=0)
        st.float("records_per_window", lo=0.0)
        st.float("loss_fraction_of_record_tokens", lo=0.0, hi=1.0)
        st.float("loss_fraction_of_windows", lo=0.0, hi=1.0)
        for what in SFT_FILES:
            if sft_file(split, what) not in files.data:
                files.fail(sft_file(split, what), "a checksum entry", MISSING)


def _per_split(f: Fields, key: str) -> None:
    """f[key] is {"train": int >= 0, "val": int >= 0}."""
    counts = _obj(f, key)
    for split in SPLITS:
        counts.int(split, lo=0)


def _hex64(f: Fields, key: str) -> str:
    """A lowercase hex SHA-256."""
    value = f.str(key)
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        f.fail(key, "a SHA-256 (64 lowercase hex digits)", value)
    return value


def _file_name(f: Fields, key: str) -> str:
    """A plain file name inside the folder (no path: a manifest may not point outside)."""
    return _check_name(f, key, f.str(key))


def _check_name(f: Fields, key: str, value: object) -> str:
    if not isinstance(value, str):
        f.fail(key, "a file name", value)
    if value in ("", ".", "..") or any(c in value for c in "/\\\0"):
        f.fail(key, "a plain file name inside the folder", value)
    return value


def _obj(f: Fields, key: str) -> Fields:
    """f[key] as Fields, refused by its own name unless it is an object."""
    if not isinstance(f.get(key), dict):
        f.fail(key, "a JSON object", f.data[key])
    return f.obj(key)


def _objects(f: Fields, key: str) -> list[Fields]:
    """The items of the list f[key], each an object named `key[i]`."""
    items = f.list(key)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            f.fail(f"{key}[{i}]", "a JSON object", item)
    return list(f.objects(key))


def folder_tokenizer(folder: Path, manifest: dict):
    """The folder's tokenizer, checked whole against the manifest's tokenizer.sha256: a
    tokenizer swapped after preparation (even one of the same size) is refused. Ours, or
    an imported model's byte-level BPE with its chat template (prepare-sft --tokenizer RUN)."""
    from euler.tokenizer import load_any

    path = Path(folder) / manifest["tokenizer"]["file"]
    tok = load_any(path)
    want = manifest["tokenizer"]["sha256"]
    if tok.sha256 != want:
        raise EulerError(
            f"{path}: SHA-256 {tok.sha256[:12]}... differs from {Path(folder) / MANIFEST_NAME}'s "
            f"tokenizer.sha256 {want[:12]}... (replaced after preparation; prepare the "
            "folder again)"
        )
    return tok


def data_identity(folder: Path, manifest: dict) -> dict:
    """What a run records of the data folder it starts on: the manifest's SHA-256, the
    tokenizer's, and each data file's (as the manifest gives them)."""
    from euler.data.files import sha256_file

    return {
        "folder": str(folder),
        "manifest_sha256": sha256_file(Path(folder) / MANIFEST_NAME),
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
        "files": {name: e["sha256"] for name, e in sorted(manifest["files"].items())},
    }


def identity_change(old: dict, new: dict) -> str | None:
    """None if two data_identity records name the same data, else what changed, in words."""
    if old["manifest_sha256"] == new["manifest_sha256"]:
        return None
    if old["tokenizer_sha256"] != new["tokenizer_sha256"]:
        return (
            f"its tokenizer changed ({old['tokenizer_sha256'][:12]}... to "
            f"{new['tokenizer_sha256'][:12]}...)"
        )
    a, b = old["files"], new["files"]
    changed = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
    gone, added = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    parts = [f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
             for what, names in (("changed", changed), ("removed", gone), ("added", added))
             if names]  # fmt: skip
    return "; ".join(parts) if parts else "its manifest changed (prepared again)"
