"""`euler data verify`: read every byte of a prepared folder against its manifest.

Opening a folder for training checks sizes and sampled checksums only (checksums.py says
why); this reads each file whole: its SHA-256, the tokenizer's hash and vocabulary, and
every token id, offset and mask value, so that a flipped byte anywhere is named.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from euler.data.checksums import check_full
from euler.data.files import sha256_file
from euler.data.manifest import SPLITS, read_manifest
from euler.data.shards import first_out_of_range, open_shard, read_header, token_dtype
from euler.errors import EulerError


def verify_folder(folder: Path) -> dict:
    """Check a prepared folder in full; EulerError at the first fault. Returns the kind,
    the number of files and bytes read, and the seconds taken."""
    from euler.data.sft import SFTDataset
    from euler.tokenizer import load_any

    t0 = time.perf_counter()
    folder = Path(folder)
    m = read_manifest(folder)
    tok_path = folder / m["tokenizer"]["file"]
    tok = load_any(tok_path)  # ours, or an imported model's (prepare-sft --tokenizer RUN)
    if sha256_file(tok_path) != m["tokenizer"]["sha256"] or tok.sha256 != m["tokenizer"]["sha256"]:
        raise EulerError(f"{tok_path}: SHA-256 differs from the manifest's tokenizer.sha256")
    V = m["tokenizer"]["vocab_size"]
    if tok.vocab_size != V:
        raise EulerError(f"{tok_path}: {tok.vocab_size} tokens, the manifest says {V}")
    n_bytes = 0
    for name, entry in m["files"].items():
        path = folder / name
        if not path.is_file():
            raise EulerError(f"{path}: listed in the manifest but missing")
        read_header(path)  # a foreign file is named as such before its checksum
        check_full(path, entry)
        n_bytes += entry["bytes"]
    if m["kind"] == "pretrain":
        for src in m["sources"]:
            for split in SPLITS:
                for name in src["shards"][split]:
                    _check_ids(folder / name, V)
    else:
        for split in SPLITS:
            SFTDataset(folder, split)  # offsets, mask and token ids, checked on opening
        heldout = folder / m["heldout"]["file"]
        if not heldout.is_file() or sha256_file(heldout) != m["heldout"]["sha256"]:
            raise EulerError(f"{heldout}: missing, or its SHA-256 differs from the manifest's")
    return {
        "kind": m["kind"],
        "files": len(m["files"]) + 1,
        "bytes": n_bytes + tok_path.stat().st_size,
        "seconds": time.perf_counter() - t0,
    }


def _check_ids(path: Path, vocab_size: int) -> None:
    """Every id of a token shard below vocab_size, else EulerError naming the position."""
    ids = open_shard(path, vocab_size, np.dtype(token_dtype(vocab_size)).itemsize)
    bad = first_out_of_range(ids, vocab_size)
    if bad >= 0:
        raise EulerError(
            f"{path}: position {bad}: token id {int(ids[bad])} is outside the vocabulary "
            f"(0..{vocab_size - 1})"
        )
