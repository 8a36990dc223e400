"""Checkpoints: one self-describing safetensors file per run, written atomically.

A checkpoint holds the parameters under their param_table names (`tok_emb`,
`layers.0.attn.wq`, ...), the AdamW moments as `adamw.m.<name>` and `adamw.v.<name>`
(absent in a weights-only export), and string metadata: the model config JSON, the train
config JSON, the training state JSON (step, AdamW step count, loader and RNG state), the
tokenizer's canonical JSON and a SHA-256 over every tensor's bytes.

Rules it keeps:
- Atomic: bytes go to a temporary file in the same folder, are fsynced, then renamed over
  the old file, so a crash or a full disk during a save leaves the previous checkpoint.
- Refuse, in one line, a file that is truncated, altered (checksum), from another format
  version, or whose tensors do not match the config it claims.
- Tensors are stored in the training dtype (float32); loading casts to the dtype asked for,
  so a float32 checkpoint loads on any backend.
- No pickle: tensors are raw little-endian arrays and everything else is JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from euler.data.files import default_mode
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout
from euler.schema import Fields, parse_json

FORMAT = "nanoeuler-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.safetensors"
MOMENTS = ("m", "v")


@dataclass
class Checkpoint:
    """A loaded checkpoint: config, flat host parameters (and moments), state, tokenizer."""

    cfg: ModelConfig
    params: np.ndarray  # (P,) flat, in ParamLayout order
    moments: dict[str, np.ndarray] | None  # {"m": (P,), "v": (P,)} or None (weights only)
    state: dict = field(default_factory=dict)  # step, adam_step, loader/RNG state
    train_config: dict = field(default_factory=dict)
    tokenizer_json: str = ""
    path: Path | None = None

    @property
    def step(self) -> int:
        return int(self.state.get("step", 0))

    def tokenizer(self):
        """The embedded tokenizer (ours, or an imported model's byte-level BPE with its chat
        template), validated as a tokenizer file is."""
        from euler.tokenizer import loads_any

        if not self.tokenizer_json.strip():  # not a JSON error: there is no entry at all
            raise EulerError(f"{self.path}: tokenizer: missing from the metadata (the "
                             "checkpoint holds no tokenizer)")  # fmt: skip
        return loads_any(self.tokenizer_json, f"{self.path}: tokenizer")

    @property
    def tokenizer_sha256(self) -> str:
        return hashlib.sha256(self.tokenizer_json.encode()).hexdigest()


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or the checkpoint inside a run folder."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise EulerError(f"checkpoint not found: {path}")
    return path


def read_tokenizer(path: str | Path):
    """The tokenizer a checkpoint file (or a run folder's) carries, read from its header
    alone, no tensor loaded: what `euler data prepare-sft --tokenizer RUN` takes from an
    imported model, whose foreign tokenizer and chat template live only in its checkpoint."""
    path = resolve(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        data = head + f.read(min(n, max(size - 8, 0)))
    meta = _metadata(data, path, size)
    if not isinstance(meta.get("tokenizer", ""), str):
        raise EulerError(f"{path}: tokenizer: expected a string")
    return Checkpoint(None, None, None, tokenizer_json=meta.get("tokenizer", ""),
                      path=path).tokenizer()  # fmt: skip


def _checksum(tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def to_bytes(
    cfg: ModelConfig,
    params: np.ndarray,
    moments: dict[str, np.ndarray] | None,
    state: dict,
    train_config: dict,
    tokenizer_json: str,
) -> bytes:
    """The safetensors file for host arrays params (P,) and moments {"m", "v"} (P,)."""
    layout = ParamLayout(cfg)
    tensors: dict[str, np.ndarray] = {}
    for name, (off, shape) in layout.offsets.items():
        n = int(np.prod(shape))
        tensors[name] = np.ascontiguousarray(params[off : off + n].reshape(shape))
        for key, flat in (moments or {}).items():
            tensors[f"adamw.{key}.{name}"] = np.ascontiguousarray(
                flat[off : off + n].reshape(shape)
            )
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "model_config": cfg.to_json(),
        "train_config": json.dumps(train_config, sort_keys=True),
        "state": json.dumps(state, sort_keys=True),
        "tokenizer": tokenizer_json,
        "sha256": _checksum(tensors),
    }
    return st_save(tensors, metadata=metadata)


def _write_bytes(f, data: bytes) -> None:
    """Write everything to an open file; a separate function so tests can make the disk fill."""
    f.write(data)


def write_atomic(path: Path, data: bytes, what: str = "checkpoint") -> None:
    """Replace `path` with `data` via a fsynced temporary file (`.NAME.*.tmp`) and a rename.

    On any failure (a full disk, an interrupt) the temporary file is removed and the old
    file is untouched; the error names what happened and says that the previous `what` is
    kept.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, default_mode())  # mkstemp's 0600 would make the file private
    try:
        with os.fdopen(fd, "wb") as f:
            _write_bytes(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            kept = f"the previous {what} is kept" if path.exists() else "nothing was written"
            raise EulerError(f"could not write {path}: {e.strerror or e}; {kept}") from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save(
    path: str | Path,
    cfg: ModelConfig,
    params: np.ndarray,
    moments: dict[str, np.ndarray] | None,
    state: dict,
    train_config: dict,
    tokenizer_json: str,
) -> None:
    """Write a checkpoint atomically; refuses parameters that are not all finite."""
    if not np.isfinite(params).all():
        raise EulerError(f"refusing to save non-finite parameters to {path}")
    write_atomic(Path(path), to_bytes(cfg, params, moments, state, train_config, tokenizer_json))


_FOREIGN = {  # what a file that is not safetensors most likely is, by its first bytes
    b"\x80": "a Python pickle (never loaded: it can run code)",
    b"PK\x03\x04": "a zip archive (a PyTorch .pt/.bin save, which holds pickles)",
    b"\x89HDF": "an HDF5 file",
}


def _metadata(data: bytes, where: Path, size: int | None = None) -> dict[str, str]:
    """The __metadata__ of a safetensors byte string (8-byte length, then a JSON header),
    after checking that the tensors the header lists fit in the file (of `size` bytes:
    len(data) unless data holds only the header)."""
    size = len(data) if size is None else size
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
    if len(data) < 10 or data[8:9] != b"{":
        what = next((w for magic, w in _FOREIGN.items() if data.startswith(magic)), None)
        if what is not None:
            raise EulerError(f"{where}: not a checkpoint: this is {what}")
        raise EulerError(f"{where}: not a checkpoint (no safetensors header)")
    if n > len(data) - 8:
        raise EulerError(
            f"{where}: truncated checkpoint (its header claims {n:,} bytes, "
            f"the file has {size - 8:,} after the length)"
        )
    header = Fields(parse_json(data[8 : 8 + n], f"{where} header"), f"{where} header")
    ends = [
        info["data_offsets"][1]
        for key, info in header.data.items()
        if key != "__metadata__" and isinstance(info, dict)
        and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
        and isinstance(info["data_offsets"][1], int)
    ]  # fmt: skip
    if ends and 8 + n + max(ends) > size:
        raise EulerError(
            f"{where}: truncated checkpoint (its tensors end at byte {8 + n + max(ends):,}, "
            f"the file has {size:,})"
        )
    meta = header.get("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise EulerError(f"{where}: not a NanoEuler checkpoint (a safetensors file of weights?)")
    for key, value in meta.items():
        if not isinstance(value, str):
            header.obj("__metadata__").fail(key, "a string", value)
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise EulerError(
            f"{where}: checkpoint format version {meta.get('format_version')}, "
            f"this build reads {FORMAT_VERSION}"
        )
    return meta


def _meta_json(meta: dict[str, str], key: str, where: Path) -> Fields:
    """A metadata entry that holds a JSON object, as Fields named `CHECKPOINT: KEY`."""
    name = f"{where}: {key}"
    if key not in meta:
        raise EulerError(f"{name}: missing from the metadata")
    return Fields(parse_json(meta[key], name), name)


def load(path: str | Path, dtype=np.float32) -> Checkpoint:
    """Read and verify a checkpoint file (or a run folder's); EulerError in one line if bad.

    Checked before anything is allocated for the model: the header, the config, and that
    the file's tensors have exactly the shapes the config needs; after: the checksum, and
    that every value is finite (naming the first tensor that is not).
    """
    path = resolve(path)
    data = path.read_bytes()
    meta = _metadata(data, path)
    try:
        tensors = st_load(data)
    except Exception as e:  # safetensors raises its own error type for any malformed file
        raise EulerError(f"{path}: corrupt checkpoint ({str(e).splitlines()[0]})") from None
    if _checksum(tensors) != meta.get("sha256"):
        raise EulerError(f"{path}: corrupt checkpoint (tensor checksum mismatch)")
    cfg = ModelConfig.from_dict(
        _meta_json(meta, "model_config", path).data, f"{path}: model_config"
    )
    state = _meta_json(meta, "state", path)
    state.int("step", lo=0, default=0)
    train_config = _meta_json(meta, "train_config", path).data
    if not isinstance(meta.get("tokenizer", ""), str):
        raise EulerError(f"{path}: tokenizer: expected a string")
    layout = ParamLayout(cfg)
    keys = [k for k in MOMENTS if any(n.startswith(f"adamw.{k}.") for n in tensors)]
    expected = {}
    for name, (off, shape) in layout.offsets.items():
        for k in ["params", *keys]:
            expected[name if k == "params" else f"adamw.{k}.{name}"] = (k, off, shape)
    for full, (_, _, shape) in expected.items():
        t = tensors.get(full)
        if t is None or t.shape != shape:
            got = "missing" if t is None else f"shape {t.shape}"
            raise EulerError(f"{path}: tensor {full} is {got}, the config needs {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise EulerError(f"{path}: unexpected tensor {extra[0]} for this config")
    flats = {k: np.empty(layout.size, dtype=dtype) for k in ["params", *keys]}
    for full, (k, off, _) in expected.items():
        t = tensors[full]
        if not np.isfinite(t).all():
            raise EulerError(f"{path}: tensor {full} holds non-finite values (NaN or inf)")
        flats[k][off : off + t.size] = t.reshape(-1)
    moments = {k: flats[k] for k in keys} if keys else None
    return Checkpoint(
        cfg, flats["params"], moments, state.data, train_config, meta.get("tokenizer", ""), path
    )


def check_compatible(ck: Checkpoint, cfg: ModelConfig, what: str = "the run") -> None:
    """Refuse a checkpoint whose architecture differs from cfg, naming the first field."""
    a, b = ck.cfg.to_dict(), cfg.to_dict()
    for key in a:
        if a[key] != b.get(key):
            raise EulerError(
                f"{ck.path}: checkpoint has {key}={a[key]}, but {what} needs {key}={b.get(key)}"
            )
