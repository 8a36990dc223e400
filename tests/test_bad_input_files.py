"""Strangers' checkpoints, Hugging Face folders and flags of export, import, chat, info,
gradcheck and bench: each refused in one line naming the file, field or flag, and nothing
the command was given is changed (tests/bad_input.py)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from euler.tokenizer import Tokenizer
from safetensors.numpy import save as st_save

from euler.interop.hf_export import export_hf
from euler.model.config import ModelConfig, get_preset
from euler.model.params import ParamLayout, init_params
from euler.training import checkpoint
from tests.bad_input import Case, assert_refused, snapshot
from tests.train_helpers import run_cli

CFG = get_preset("tiny")
TOKENIZER = Tokenizer([]).to_json()  # the 260 byte and special tokens, no merges


def tensors_of(params: np.ndarray, cfg: ModelConfig = CFG) -> dict[str, np.ndarray]:
    layout = ParamLayout(cfg)
    return {
        name: params[off : off + int(np.prod(shape))].reshape(shape).copy()
        for name, (off, shape) in layout.offsets.items()
    }


def metadata(**changes: str | None) -> dict[str, str]:
    """A good checkpoint's metadata with `changes` (None: the key left out; the checksum is
    set by build())."""
    meta = {
        "format": checkpoint.FORMAT,
        "format_version": str(checkpoint.FORMAT_VERSION),
        "model_config": CFG.to_json(),
        "train_config": json.dumps({"kind": "pretrain"}),
        "state": json.dumps({"step": 3}),
        "tokenizer": TOKENIZER,
    }
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def build(tensors: dict[str, np.ndarray] | None = None, **changes: str | None) -> bytes:
    """A checkpoint's bytes with its checksum right, so the damage is exactly `changes`."""
    tensors = tensors if tensors is not None else tensors_of(init_params(ParamLayout(CFG), 0))
    meta = metadata(**changes)
    meta.setdefault("sha256", checkpoint._checksum(tensors))
    return st_save(tensors, metadata=meta)


def raw_header(header: object, payload: bytes = b"") -> bytes:
    """A safetensors-shaped file: 8-byte length, the header as JSON, then payload."""
    data = json.dumps(header).encode()
    return struct.pack("<Q", len(data)) + data + payload


def with_tensors(edit) -> bytes:
    t = tensors_of(init_params(ParamLayout(CFG), 0))
    edit(t)
    return build(t)


def _nan(t):
    t["layers.1.mlp.w_up"][0, 0] = np.nan


def _drop(t):
    del t["final_norm"]


def _reshape(t):
    t["final_norm"] = np.ones(CFG.d_model + 1, np.float32)


def _extra(t):
    t["bonus"] = np.ones(3, np.float32)


def _flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x40])


GOOD = build()
CONFIG = CFG.to_dict()
PICKLE = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."
ZIP = b"PK\x03\x04" + bytes(60)

# (id, the checkpoint's bytes, words the error names besides the file)
CHECKPOINTS = [
    ("empty", b"", ["not a checkpoint"]),
    ("five-bytes", b"abcde", ["not a checkpoint"]),
    ("random-bytes", np.random.default_rng(0).bytes(4000), ["not a checkpoint"]),
    ("pickle", PICKLE, ["pickle"]),
    ("zip", ZIP, ["zip"]),
    ("hdf5", b"\x89HDF\r\n\x1a\n" + bytes(100), ["HDF5"]),
    ("truncated", GOOD[: len(GOOD) // 2], ["truncated"]),
    ("header-too-long", struct.pack("<Q", 10**12) + b"{}", ["truncated"]),
    ("header-not-json", struct.pack("<Q", 5) + b"{abc}", ["invalid JSON"]),
    ("header-not-utf8", struct.pack("<Q", 4) + b'{"\xff"', ["not UTF-8"]),
    ("header-a-list", raw_header([1, 2]), ["not a checkpoint"]),
    ("header-object-list", struct.pack("<Q", 8) + b'{"a": [}', ["invalid JSON"]),
    ("header-no-metadata", raw_header({}), ["not a NanoEuler checkpoint"]),
    ("weights-only-safetensors", st_save({"w": np.ones(2, np.float32)}), ["not a NanoEuler"]),
    ("other-format", build(format="gguf"), ["not a NanoEuler checkpoint"]),
    ("format-version-2", build(format_version="2"), ["version 2"]),
    (
        "metadata-number",
        raw_header({"__metadata__": {"format": checkpoint.FORMAT, "state": 3}}),
        ["state", "a string"],
    ),  # fmt: skip
    ("config-not-json", build(model_config="{oops"), ["model_config", "invalid JSON"]),
    ("config-a-list", build(model_config="[1, 2]"), ["model_config", "a JSON object"]),
    ("config-a-string", build(model_config='"tiny"'), ["model_config", "a JSON object"]),
    (
        "config-missing-field",
        build(model_config=json.dumps({k: v for k, v in CONFIG.items() if k != "n_layer"})),
        ["model_config", "n_layer", "missing"],
    ),  # fmt: skip
    (
        "config-string-number",
        build(model_config=json.dumps({**CONFIG, "d_model": "32"})),
        ["d_model", "an integer", "'32'"],
    ),  # fmt: skip
    (
        "config-float-int",
        build(model_config=json.dumps({**CONFIG, "n_layer": 2.5})),
        ["n_layer", "an integer"],
    ),  # fmt: skip
    (
        "config-bool-int",
        build(model_config=json.dumps({**CONFIG, "n_head": True})),
        ["n_head", "an integer"],
    ),  # fmt: skip
    (
        "config-null",
        build(model_config=json.dumps({**CONFIG, "context": None})),
        ["context", "null"],
    ),  # fmt: skip
    (
        "config-negative",
        build(model_config=json.dumps({**CONFIG, "n_layer": -1})),
        ["n_layer"],
    ),  # fmt: skip
    (
        "config-unknown-field",
        build(model_config=json.dumps({**CONFIG, "dropout": 0.1})),
        ["dropout", "unknown"],
    ),  # fmt: skip
    (
        "config-huge-vocab",
        build(model_config=json.dumps({**CONFIG, "vocab_size": 10**9})),
        ["tok_emb"],
    ),  # fmt: skip
    (
        "config-odd-heads",
        build(model_config=json.dumps({**CONFIG, "n_head": 3})),
        ["d_model", "n_head"],
    ),  # fmt: skip
    (
        "config-eps-string",
        build(model_config=json.dumps({**CONFIG, "norm_eps": "1e-5"})),
        ["norm_eps", "a finite number"],
    ),  # fmt: skip
    ("config-version", build(model_config=json.dumps({**CONFIG, "version": 7})), ["version"]),
    ("state-not-json", build(state="step=3"), ["state", "invalid JSON"]),
    ("state-a-list", build(state="[3]"), ["state", "a JSON object"]),
    ("state-step-string", build(state='{"step": "3"}'), ["step", "an integer"]),
    ("state-step-negative", build(state='{"step": -2}'), ["step", ">= 0"]),
    ("tokenizer-missing", build(tokenizer=None), ["tokenizer", "missing"]),
    ("train-config-not-json", build(train_config="{"), ["train_config", "invalid JSON"]),
    ("train-config-a-list", build(train_config="[]"), ["train_config", "a JSON object"]),
    ("no-model-config", build(model_config=None), ["model_config", "missing"]),
    ("no-state", build(state=None), ["state", "missing"]),
    ("checksum", _flip(GOOD), ["checksum"]),
    ("missing-tensor", with_tensors(_drop), ["final_norm", "missing"]),
    ("wrong-shape", with_tensors(_reshape), ["final_norm", "shape"]),
    ("extra-tensor", with_tensors(_extra), ["bonus"]),
    ("nan-weight", with_tensors(_nan), ["layers.1.mlp.w_up", "non-finite"]),
    ("tokenizer-garbage", build(tokenizer="{}"), ["tokenizer"]),
    ("tokenizer-not-json", build(tokenizer="<html>"), ["tokenizer"]),
]


def _write_checkpoint(data: bytes):
    return lambda root: (root / "c.safetensors").write_bytes(data)


CHECKPOINT_CASES = [
    Case(f"export-{name}", ("export", "--checkpoint", "{root}/c.safetensors", "--out",
                            "{root}/hf"), ("c.safetensors", *words), _write_checkpoint(data))
    for name, data, words in CHECKPOINTS
]  # fmt: skip
# the same loader behind chat and sft --checkpoint, a few of each
CHECKPOINT_CASES += [
    Case(f"chat-{name}", ("chat", "--checkpoint", "{root}/c.safetensors", "--prompt", "hi"),
         ("c.safetensors", *words), _write_checkpoint(data))
    for name, data, words in CHECKPOINTS if name in ("pickle", "truncated", "nan-weight",
                                                     "config-a-list", "checksum")
]  # fmt: skip


def _run_folder(root: Path) -> None:
    """A run folder: run.json and a good checkpoint."""
    (root / "run").mkdir()
    (root / "run" / "run.json").write_text("{}")
    (root / "run" / "checkpoint.safetensors").write_bytes(GOOD)


def _exported(root: Path) -> None:
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text("{}")
    (root / "hf" / "notes.txt").write_text("mine")
    (root / "c.safetensors").write_bytes(GOOD)


EXPORT_CASES = [
    Case("export-missing", ("export", "--checkpoint", "{root}/nope", "--out", "{root}/hf"),
         ("{root}/nope",)),  # fmt: skip
    Case("export-folder-without-checkpoint",
         ("export", "--checkpoint", "{root}", "--out", "{root}/hf"), ("checkpoint",)),  # fmt: skip
    Case("export-into-its-run", ("export", "--checkpoint", "{root}/run", "--out", "{root}/run",
                                 "--overwrite"), ("--out", "--checkpoint", "an input"),
         _run_folder),
    Case("export-into-parent-of-run", ("export", "--checkpoint", "{root}/run", "--out", "{root}",
                                       "--overwrite"), ("--out", "--checkpoint", "an input"),
         _run_folder),
    Case("export-over-foreign-files", ("export", "--checkpoint", "{root}/c.safetensors", "--out",
                                       "{root}/hf", "--overwrite"),
         ("--out", "no euler command wrote"), _exported),
    Case("export-exists", ("export", "--checkpoint", "{root}/c.safetensors", "--out", "{root}/hf"),
         ("--out", "--overwrite"), _exported),
    Case("export-no-parent", ("export", "--checkpoint", "{root}/c.safetensors", "--out",
                              "{root}/a/b/hf"), ("--out", "{root}/a/b"),
         _write_checkpoint(GOOD)),
    Case("export-out-a-file", ("export", "--checkpoint", "{root}/c.safetensors", "--out",
                               "{root}/c.safetensors", "--overwrite"), ("--out",),
         _write_checkpoint(GOOD)),
    Case("export-format", ("export", "--checkpoint", "{root}/c.safetensors", "--out", "{root}/x",
                           "--format", "gguf"), ("--format", "gguf"), _write_checkpoint(GOOD)),
]  # fmt: skip


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A good Hugging Face export of a tiny checkpoint."""
    root = tmp_path_factory.mktemp("hf")
    (root / "c.safetensors").write_bytes(GOOD)
    export_hf(root / "c.safetensors", root / "hf")
    HF_SOURCE[:] = [root / "hf"]
    return root / "hf"


def _hf(edit=None, config: dict | None = None, drop: tuple[str, ...] = (),
        config_drop: tuple[str, ...] = ()):  # fmt: skip
    """setup(root): a copy of the good export as root/hf, then the damage: files dropped,
    config.json's fields changed or dropped, then edit(hf)."""

    def setup(root: Path) -> None:
        hf = root / "hf"
        shutil.copytree(HF_SOURCE[0], hf)
        for name in drop:
            (hf / name).unlink()
        if config is not None or config_drop:
            c = {**json.loads((hf / "config.json").read_text()), **(config or {})}
            c = {k: v for k, v in c.items() if k not in config_drop}
            (hf / "config.json").write_text(json.dumps(c))
        if edit is not None:
            edit(hf)

    return setup


HF_SOURCE: list[Path] = []  # the good export, set by the hf_folder fixture


def _write(name: str, data: bytes | str):
    def edit(hf: Path) -> None:
        (hf / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    return edit


def _nan_weights(hf: Path) -> None:
    from safetensors.numpy import load_file

    t = load_file(hf / "model.safetensors")
    t["model.norm.weight"][0] = np.inf
    (hf / "model.safetensors").write_bytes(st_save(t))


def _sharded(weight_map: object):
    def edit(hf: Path) -> None:
        (hf / "model.safetensors").rename(hf / "part-1.safetensors")
        index = {"metadata": {}, "weight_map": weight_map}
        (hf / "model.safetensors.index.json").write_text(json.dumps(index))

    return edit


def _f64(hf: Path) -> None:
    header = {"model.norm.weight": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}
    (hf / "model.safetensors").write_bytes(raw_header(header, bytes(8)))


def _bad_offsets(hf: Path) -> None:
    header = {"model.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 4000]}}
    (hf / "model.safetensors").write_bytes(raw_header(header, bytes(16)))


def _misfit(hf: Path) -> None:
    header = {"model.norm.weight": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}
    (hf / "model.safetensors").write_bytes(raw_header(header, bytes(16)))


def _shape_strings(hf: Path) -> None:
    header = {"model.norm.weight": {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]}}
    (hf / "model.safetensors").write_bytes(raw_header(header, bytes(16)))


IMPORT = ("import", "{root}/hf", "--out", "{root}/c.safetensors")
IMPORT_CASES = [
    Case("import-not-a-folder", ("import", "{root}/nope", "--out", "{root}/c.safetensors"),
         ("{root}/nope",)),  # fmt: skip
    Case("import-no-config", IMPORT, ("config.json", "not found"), _hf(drop=("config.json",))),
    Case("import-config-not-json", IMPORT, ("config.json", "invalid JSON"),
         _hf(_write("config.json", "{"))),
    Case("import-config-list", IMPORT, ("config.json", "a JSON object"),
         _hf(_write("config.json", "[]"))),
    Case("import-config-not-utf8", IMPORT, ("config.json", "UTF-8"),
         _hf(_write("config.json", b'{"a": "\xff"}'))),
    Case("import-kv-heads-zero", IMPORT, ("num_key_value_heads",),
         _hf(config={"num_key_value_heads": 0})),
    Case("import-kv-heads-string", IMPORT, ("num_key_value_heads",),
         _hf(config={"num_key_value_heads": "4"})),
    Case("import-model-type", IMPORT, ("model_type", "'llama'"),
         _hf(config={"model_type": "gpt2"})),
    Case("import-hidden-string", IMPORT, ("hidden_size", "an integer"),
         _hf(config={"hidden_size": "32"})),
    Case("import-layers-float", IMPORT, ("num_hidden_layers", "an integer"),
         _hf(config={"num_hidden_layers": 2.0})),
    Case("import-layers-missing", IMPORT, ("num_hidden_layers", "missing"),
         _hf(config_drop=("num_hidden_layers",))),
    Case("import-layers-null", IMPORT, ("num_hidden_layers", "null"),
         _hf(config={"num_hidden_layers": None})),
    Case("import-vocab-zero", IMPORT, ("vocab_size",), _hf(config={"vocab_size": 0})),
    Case("import-vocab-huge", IMPORT, ("model.embed_tokens.weight", "1000000000"),
         _hf(config={"vocab_size": 10**9})),  # refused before 10^9 rows are allocated
    Case("import-heads-bool", IMPORT, ("num_attention_heads",),
         _hf(config={"num_attention_heads": True})),
    Case("import-head-dim", IMPORT, ("head_dim",), _hf(config={"head_dim": 4})),
    Case("import-rope-scaling", IMPORT, ("rope_scaling",),
         _hf(config={"rope_scaling": {"type": "linear", "factor": 2.0}})),
    Case("import-attention-bias", IMPORT, ("attention_bias",),
         _hf(config={"attention_bias": True})),
    Case("import-gelu", IMPORT, ("hidden_act", "'gelu'"), _hf(config={"hidden_act": "gelu"})),
    Case("import-partial-rope", IMPORT, ("partial_rotary_factor",),
         _hf(config={"partial_rotary_factor": 0.5})),
    Case("import-rope-params-list", IMPORT, ("rope_parameters", "a JSON object"),
         _hf(config={"rope_parameters": [1]})),
    Case("import-rope-type", IMPORT, ("rope_type",),
         _hf(config={"rope_parameters": {"rope_type": "yarn"}})),
    Case("import-theta-string", IMPORT, ("rope_theta", "a finite number"),
         _hf(config={"rope_parameters": {"rope_theta": "1e4"}})),
    Case("import-eps-negative", IMPORT, ("norm_eps",), _hf(config={"rms_norm_eps": -1.0})),
    Case("import-ffn-zero", IMPORT, ("intermediate_size",), _hf(config={"intermediate_size": 0})),
    Case("import-tied", IMPORT, ("tie_word_embeddings",),
         _hf(config={"tie_word_embeddings": True})),
    Case("import-no-weights", IMPORT, ("model.safetensors",), _hf(drop=("model.safetensors",))),
    Case("import-weights-pickle", IMPORT, ("model.safetensors", "not a safetensors"),
         _hf(_write("model.safetensors", PICKLE))),
    Case("import-weights-header-long", IMPORT, ("model.safetensors", "not a safetensors"),
         _hf(_write("model.safetensors", struct.pack("<Q", 10**9) + b"{}"))),
    Case("import-weights-header-list", IMPORT, ("model.safetensors", "not a safetensors"),
         _hf(_write("model.safetensors", raw_header([1])))),
    Case("import-weights-f64", IMPORT, ("model.norm.weight", "dtype", "F64"), _hf(_f64)),
    Case("import-weights-offsets", IMPORT, ("model.norm.weight", "truncated"), _hf(_bad_offsets)),
    Case("import-weights-misfit", IMPORT, ("model.norm.weight", "do not fit"), _hf(_misfit)),
    Case("import-weights-shape-strings", IMPORT, ("model.norm.weight.shape",),
         _hf(_shape_strings)),
    Case("import-weights-nan", IMPORT, ("model.norm.weight", "non-finite"), _hf(_nan_weights)),
    Case("import-index-escapes", IMPORT, ("weight_map", "a file name inside"),
         _hf(_sharded({"model.norm.weight": "../../etc/passwd"}))),
    Case("import-index-missing-shard", IMPORT, ("part-9.safetensors",),
         _hf(_sharded({"model.norm.weight": "part-9.safetensors"}))),
    Case("import-index-list", IMPORT, ("weight_map", "a JSON object"), _hf(_sharded([1, 2]))),
    Case("import-index-number", IMPORT, ("weight_map.x", "a string"), _hf(_sharded({"x": 3}))),
    Case("import-no-tokenizer", IMPORT, ("tokenizer.json", "--tokenizer"),
         _hf(drop=("tokenizer.json",))),
    Case("import-tokenizer-list", IMPORT, ("tokenizer.json", "expected a JSON object"),
         _hf(_write("tokenizer.json", "[1]"))),
    Case("import-tokenizer-merges-ints", IMPORT, ("tokenizer.json", "model.merges[0]"),
         _hf(_write("tokenizer.json", json.dumps(
             {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [3, [1]]}})))),
    Case("import-tokenizer-vocab-empty", IMPORT, ("tokenizer.json", "model.vocab", "empty"),
         _hf(_write("tokenizer.json", json.dumps(
             {"model": {"type": "BPE", "vocab": {}, "merges": []}})))),  # fmt: skip
    Case("import-tokenizer-flag-missing", (*IMPORT, "--tokenizer", "{root}/none.json"),
         ("none.json",), _hf()),
    Case("import-n-mtp", (*IMPORT, "--n-mtp", "0"), ("--n-mtp",), _hf()),
    Case("import-out-exists", IMPORT, ("--out", "--overwrite"),
         lambda root: (_hf()(root), (root / "c.safetensors").write_bytes(b"mine"))),
    Case("import-out-inside-src", ("import", "{root}/hf", "--out", "{root}/hf/model.safetensors",
                                   "--overwrite"), ("--out", "inside"), _hf()),
    Case("import-out-into-run", ("import", "{root}/hf", "--out", "{root}/run", "--overwrite"),
         ("--out", "training run"), lambda root: (_hf()(root), _run_folder(root))),
    Case("import-out-no-folder", ("import", "{root}/hf", "--out", "{root}/x/y.safetensors"),
         ("--out",), _hf()),
    Case("import-format", (*IMPORT, "--format", "onnx"), ("--format", "onnx"), _hf()),
]  # fmt: skip

FLAG_CASES = [
    Case("info-preset", ("info", "--preset", "huge"), ("--preset", "huge")),
    Case("gradcheck-samples", ("gradcheck", "--samples", "0"), ("--samples",)),
    Case("gradcheck-seed", ("gradcheck", "--seed", "-1"), ("--seed",)),
    Case("gradcheck-samples-text", ("gradcheck", "--samples", "many"), ("--samples",)),
    Case("bench-peak-inf", ("bench", "--peak", "inf"), ("--peak",)),
    Case("bench-peak-nan", ("bench", "--peak", "nan"), ("--peak",)),
    Case("bench-json-exists", ("bench", "--preset", "tiny", "--json", "{root}/b.json"),
         ("--json", "--overwrite"), lambda root: (root / "b.json").write_text("{}")),
    Case("bench-json-folder", ("bench", "--preset", "tiny", "--json", "{root}"), ("--json",)),
    Case("unknown-command", ("fly",), ("fly",)),
    Case("unknown-flag", ("info", "--color", "red"), ("--color",)),
    Case("chat-no-checkpoint", ("chat", "--prompt", "hi"), ("--checkpoint",)),
]  # fmt: skip

CASES = CHECKPOINT_CASES + EXPORT_CASES + IMPORT_CASES + FLAG_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_in_one_line(case, hf_folder, tmp_path, monkeypatch, capsys):
    assert_refused(monkeypatch, capsys, case, tmp_path / "case")


def test_the_good_files_pass(hf_folder, tmp_path, monkeypatch, capsys):
    """The cases' starting points are sound: the checkpoint exports, the export imports,
    and an export may replace an earlier export with --overwrite."""
    (tmp_path / "c.safetensors").write_bytes(GOOD)
    ck = checkpoint.load(tmp_path / "c.safetensors")
    assert ck.cfg == CFG and ck.tokenizer().vocab_size == 260
    args = ("import", str(hf_folder), "--out", str(tmp_path / "back.safetensors"))
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    np.testing.assert_array_equal(checkpoint.load(tmp_path / "back.safetensors").params, ck.params)
    out = tmp_path / "hf"
    args = ("export", "--checkpoint", str(tmp_path / "c.safetensors"), "--out", str(out))
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    before = snapshot(out)
    assert run_cli(monkeypatch, capsys, *args, "--overwrite")[0] == 0
    assert snapshot(out) == before  # the same export again, replaced whole
