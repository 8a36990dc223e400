"""Checkpoints: round trip, any-dtype load, refusals in one line, atomic saves on a full disk."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest

from euler.errors import EulerError
from euler.model.config import get_preset
from euler.model.params import ParamLayout
from euler.model.transformer import Model
from euler.training import checkpoint

CFG = get_preset("tiny")
TOKENIZER_JSON = json.dumps({"stand-in": "tokenizer"})


def _save(path, seed=0, step=3, moments=True):
    layout = ParamLayout(CFG)
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(layout.size).astype(np.float32)
    mom = {k: rng.random(layout.size).astype(np.float32) for k in ("m", "v")} if moments else None
    state = {"step": step, "adam_step": step}
    checkpoint.save(path, CFG, params, mom, state, {"kind": "pretrain"}, TOKENIZER_JSON)
    return params, mom


def test_round_trip_keeps_every_bit(tmp_path):
    path = tmp_path / "c.safetensors"
    params, mom = _save(path)
    ck = checkpoint.load(path)
    assert ck.cfg == CFG and ck.step == 3 and ck.tokenizer_json == TOKENIZER_JSON
    assert ck.params.tobytes() == params.tobytes()
    assert ck.moments["m"].tobytes() == mom["m"].tobytes()
    assert ck.moments["v"].tobytes() == mom["v"].tobytes()
    assert ck.train_config == {"kind": "pretrain"}


def test_names_say_what_the_tensors_are(tmp_path):
    from safetensors.numpy import load_file

    path = tmp_path / "c.safetensors"
    params, _ = _save(path)
    tensors = load_file(path)
    off, shape = ParamLayout(CFG).offsets["layers.1.attn.wk"]
    n = int(np.prod(shape))
    np.testing.assert_array_equal(tensors["layers.1.attn.wk"], params[off : off + n].reshape(shape))
    assert "adamw.m.mtp_heads" in tensors and "adamw.v.final_norm" in tensors


def test_float32_checkpoint_loads_as_float64(tmp_path):
    path = tmp_path / "c.safetensors"
    params, _ = _save(path, moments=False)
    ck = checkpoint.load(path, dtype=np.float64)
    assert ck.params.dtype == np.float64 and ck.moments is None
    assert (ck.params == params.astype(np.float64)).all()
    model = Model(ck.cfg, dtype=np.float64, flat_params=ck.params)  # e.g. for the gradcheck
    assert model.p["layers.0.attn.wq"].dtype == np.float64


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "truncated|corrupt"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b"\x00" * 64, "not a .*checkpoint|truncated|corrupt"),
        (lambda b: b"", "not a checkpoint"),
    ],
    ids=["truncated", "flipped-bit", "zeros", "empty"],
)
def test_damaged_checkpoints_are_refused_in_one_line(tmp_path, damage, message):
    path = tmp_path / "c.safetensors"
    _save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(EulerError, match=message) as e:
        checkpoint.load(path)
    assert "\n" not in str(e.value)


def test_other_preset_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "c.safetensors"
    _save(path)
    ck = checkpoint.load(path)
    with pytest.raises(
        EulerError, match="checkpoint has vocab_size=320, but the run needs vocab_size=512"
    ):
        checkpoint.check_compatible(ck, get_preset("small"))


def test_config_that_disagrees_with_the_tensors_is_refused(tmp_path):
    """A header that claims another architecture than its tensors hold."""
    import dataclasses

    from safetensors.numpy import load_file, save_file

    path = tmp_path / "c.safetensors"
    _save(path)
    tensors = load_file(path)
    meta = checkpoint._metadata(path.read_bytes(), path)
    other = dataclasses.replace(CFG, d_model=64)
    meta["model_config"] = other.to_json()
    save_file(tensors, path, metadata=meta)
    with pytest.raises(EulerError, match="tok_emb is shape .* needs"):
        checkpoint.load(path)


def test_missing_checkpoint_and_foreign_file(tmp_path):
    with pytest.raises(EulerError, match="checkpoint not found"):
        checkpoint.load(tmp_path)
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(3, np.float32)}, tmp_path / "checkpoint.safetensors")
    with pytest.raises(EulerError, match="not a NanoEuler checkpoint"):
        checkpoint.load(tmp_path)


def test_full_disk_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    params, _ = _save(path, seed=0, step=3)
    before = path.read_bytes()

    def write_half_then_fail(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_bytes", write_half_then_fail)
    with pytest.raises(
        EulerError, match="No space left on device; the previous checkpoint is kept"
    ):
        _save(path, seed=1, step=4)
    assert path.read_bytes() == before
    assert checkpoint.load(path).step == 3
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # no temporary left


def test_non_finite_parameters_are_never_saved(tmp_path):
    layout = ParamLayout(CFG)
    params = np.zeros(layout.size, np.float32)
    params[5] = np.nan
    with pytest.raises(EulerError, match="non-finite"):
        checkpoint.save(tmp_path / "c", CFG, params, None, {"step": 1}, {}, TOKENIZER_JSON)
    assert not (tmp_path / "c").exists()
