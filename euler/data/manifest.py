"""The manifest JSON that sits next to a folder of shards and says what they hold.

Written last (atomically) by `prepare`, so a folder with a manifest is a complete
preparation. Keys: format, version, kind ("pretrain" or "sft"), tokenizer (file,
sha256, vocab_size), split (val_fraction, seed, rule), sources (one entry per named
source with its inputs and checksums, weight, documents, tokens and shard files per
split), totals, and timing.
"""

from __future__ import annotations

import json
from pathlib import Path

from euler.data.files import write_json_atomic
from euler.errors import EulerError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "nanoeuler-shards"
MANIFEST_VERSION = 1


def write_manifest(folder: Path, manifest: dict) -> Path:
    """Stamp format/version onto `manifest` and write it as folder/manifest.json."""
    path = Path(folder) / MANIFEST_NAME
    write_json_atomic(path, {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **manifest})
    return path


def read_manifest(folder: Path, kind: str | None = None) -> dict:
    """Read folder/manifest.json; check its format, version and (if given) kind."""
    path = Path(folder) / MANIFEST_NAME
    if not Path(folder).is_dir():
        raise EulerError(f"data folder not found: {folder}")
    if not path.is_file():
        raise EulerError(f"{folder}: no {MANIFEST_NAME} (not a prepared data folder?)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EulerError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise EulerError(
            f"{path}: unknown manifest format {manifest.get('format')!r} "
            f"version {manifest.get('version')!r}"
        )
    if kind is not None and manifest.get("kind") != kind:
        raise EulerError(f"{path}: holds {manifest.get('kind')!r} data, expected {kind!r}")
    return manifest
