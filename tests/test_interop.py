"""Hugging Face Llama export and import: logits in `transformers`, tokenizer ids, round trips,
and refusals.

The fixture is a tiny model with large random weights (std 0.2, norm weights away from 1, a
non-default RoPE base), so that a wrong tensor name, transposition or rotary convention
moves the logits far more than the 1e-4 tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from euler.tokenizer import Tokenizer
from safetensors.numpy import load_file, save_file

from euler.errors import EulerError
from euler.interop.hf_export import SIDE_FILE, WEIGHTS, export_hf
from euler.interop.hf_import import import_hf
from euler.model.config import get_preset
from euler.model.params import ParamLayout, init_params
from euler.model.transformer import Model
from euler.training import checkpoint as ckpt

TEXT = "The cat sat on the mat. The dog sat on the log; café 東京 42.\n"
SAMPLES = [
    "The cat sat.",
    "  def f(x):\n\treturn x ** 2  # café\n",
    "<|user|>Hi<|end|><|assistant|>東京 ünïcödé 1234567",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(checkpoint path, tokenizer) of a tiny model with K=4 heads."""
    d = tmp_path_factory.mktemp("interop")
    (d / "src.txt").write_text(TEXT * 50, encoding="utf-8")
    tok = Tokenizer.train([d / "src.txt"], 300)
    cfg = dataclasses.replace(
        get_preset("tiny"), vocab_size=tok.vocab_size, rope_base=500.0, norm_eps=1e-6,
        init_std=0.2,
    )  # fmt: skip
    layout = ParamLayout(cfg)
    params = init_params(layout, seed=1)
    rng = np.random.default_rng(2)
    for name, (off, shape) in layout.offsets.items():
        if name.endswith("norm"):
            params[off : off + shape[0]] = 1.0 + 0.3 * rng.standard_normal(shape[0])
    path = d / "ck.safetensors"
    ckpt.save(path, cfg, params, None, {"step": 7}, {}, tok.to_json())
    return path, tok


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "export"
    export_hf(model[0], out)
    return out


def _worst(ours: np.ndarray, theirs: np.ndarray, what: str) -> str:
    i = np.unravel_index(np.argmax(np.abs(ours - theirs)), ours.shape)
    return f"{what}: worst at {i}: ours {ours[i]:.7f}, transformers {theirs[i]:.7f}"


def test_logits_equal_transformers(model, exported, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ck = ckpt.load(model[0])
    hf = transformers.LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    tokens = np.random.default_rng(3).integers(0, ck.cfg.vocab_size, (2, ck.cfg.context))
    ours = Model(ck.cfg, flat_params=ck.params)
    ours.forward(tokens)
    with torch.no_grad():
        out = hf(torch.tensor(tokens), output_hidden_states=True)
    theirs = out.logits.numpy()
    head0 = ours.head_logits(0)
    assert np.abs(head0).max() > 1.0  # the comparison below is not between near-zeros
    assert np.allclose(head0, theirs, rtol=0, atol=1e-4), _worst(head0, theirs, "head 0")
    # heads 1..K-1 from the side file, applied to transformers' final (normed) hidden states
    side = load_file(exported / SIDE_FILE)
    xf = out.hidden_states[-1].numpy()
    for k in range(1, ck.cfg.n_mtp):
        theirs = xf @ side[f"mtp_heads.{k}"].T
        mine = ours.head_logits(k)
        assert np.allclose(mine, theirs, rtol=0, atol=1e-4), _worst(mine, theirs, f"head {k}")

    # transformers' own tokenizer class gives our ids, and its chat template our prompt
    from euler.data import encode_prompt

    hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
    for text in SAMPLES:
        assert hf_tok(text)["input_ids"] == model[1].encode(text, allow_special=True).tolist()
    turn = [{"role": "user", "content": SAMPLES[1]}]
    chat = hf_tok.apply_chat_template(turn, return_dict=True)["input_ids"]
    assert chat == encode_prompt(model[1], SAMPLES[1]).tolist()

    # a folder re-saved by transformers itself (its own config.json and tokenizer.json
    # spellings) imports too, with head 0 only
    resaved = tmp_path / "resaved"
    hf.save_pretrained(resaved)
    hf_tok.save_pretrained(resaved)
    path, cfg, _ = import_hf(resaved, tmp_path / "back.safetensors")
    assert cfg == dataclasses.replace(ck.cfg, n_mtp=1)
    back = ParamLayout(cfg).views(ckpt.load(path).params)
    views = ParamLayout(ck.cfg).views(ck.params)
    for name, _, _ in ParamLayout(cfg).table:
        want = views[name][:1] if name == "mtp_heads" else views[name]
        assert np.array_equal(back[name], want), name

    # bfloat16 weights widen exactly
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    shutil.copy(exported / "tokenizer.json", tmp_path / "bf16" / "tokenizer.json")
    path, _, _ = import_hf(tmp_path / "bf16", tmp_path / "bf16.safetensors")
    emb = torch.tensor(views["tok_emb"]).to(torch.bfloat16).float().numpy()
    assert np.array_equal(ParamLayout(cfg).views(ckpt.load(path).params)["tok_emb"], emb)


def test_tokenizer_gives_our_ids(model, exported):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(exported / "tokenizer.json"))
    tok = model[1]
    for text in SAMPLES:
        assert hf.encode(text).ids == tok.encode(text, allow_special=True).tolist(), text


def test_export_import_round_trips_bit_for_bit(model, exported, tmp_path):
    path, cfg, notes = import_hf(exported, tmp_path / "ck.safetensors")
    a, b = ckpt.load(model[0]), ckpt.load(path)
    assert notes == [] and cfg == a.cfg == b.cfg
    assert a.params.view(np.uint32).tolist() == b.params.view(np.uint32).tolist()
    assert b.tokenizer_json == a.tokenizer_json
    export_hf(path, tmp_path / "again")
    for name in ("config.json", WEIGHTS, SIDE_FILE, "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (exported / name).read_bytes(), name


def test_without_side_file_heads_are_one_or_initialised(model, exported, tmp_path):
    src = tmp_path / "noside"
    shutil.copytree(exported, src)
    (src / SIDE_FILE).unlink()
    _, cfg, notes = import_hf(src, tmp_path / "k1.safetensors")
    assert cfg.n_mtp == 1 and notes == []
    path, cfg, notes = import_hf(src, tmp_path / "k4.safetensors", n_mtp=4)
    assert cfg.n_mtp == 4 and "heads 1..3 are freshly initialised" in notes[0]
    heads = ParamLayout(cfg).views(ckpt.load(path).params)["mtp_heads"]
    want = ParamLayout(cfg).views(ckpt.load(model[0]).params)["mtp_heads"]
    assert np.array_equal(heads[0], want[0]) and not np.array_equal(heads[1], want[1])


def _edit_config(src, **fields):
    c = json.loads((src / "config.json").read_text())
    c.update(fields)
    (src / "config.json").write_text(json.dumps(c))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"attention_bias": True}, "attention_bias: expected False"),
        ({"mlp_bias": True}, "mlp_bias: expected False"),
        (
            {"hidden_act": "gelu"},
            "hidden_act: expected 'silu' (NanoEuler's block), found the string 'gelu'",
        ),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling is set"),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}},
            "rope_type: expected 'default', found the string 'llama3'",
        ),
        ({"sliding_window": 8}, "sliding_window is set"),
        ({"head_dim": 16}, "head_dim 16"),
        ({"num_attention_heads": 32, "head_dim": None}, "odd head size (1)"),
        ({"model_type": "mistral"}, "model_type: expected 'llama', found the string 'mistral'"),
        ({"hidden_size": None}, "hidden_size: expected an integer >= 1, found null"),
    ],
)
def test_configs_we_cannot_express_are_refused(exported, tmp_path, fields, message):
    src = tmp_path / "src"
    shutil.copytree(exported, src)
    _edit_config(src, **fields)
    with pytest.raises(EulerError, match=r"/src/config\.json: ") as e:
        import_hf(src, tmp_path / "out.safetensors")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out.safetensors").exists()


def test_bad_tensors_tokenizers_and_outputs_are_refused(model, exported, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(exported, src)
    tensors = load_file(src / WEIGHTS)
    save_file({**tensors, "model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)},
              src / WEIGHTS, metadata={"format": "pt"})  # fmt: skip
    with pytest.raises(EulerError, match="unexpected tensor model.layers.0.self_attn.q_proj.bias"):
        import_hf(src, tmp_path / "out.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, src / WEIGHTS, metadata={"format": "pt"})
    with pytest.raises(EulerError, match="tensor model.norm.weight is missing"):
        import_hf(src, tmp_path / "out.safetensors")

    src = tmp_path / "tok"
    shutil.copytree(exported, src)
    doc = json.loads((src / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {"type": "Metaspace"}
    (src / "tokenizer.json").write_text(json.dumps(doc))
    # not ours, and not a byte-level BPE either: the foreign reader names the field
    with pytest.raises(EulerError, match=r"tokenizer.json: pre_tokenizer: expected a ByteLevel"):
        import_hf(src, tmp_path / "out.safetensors")
    model[1].save(tmp_path / "ours.json")  # our own tokenizer file is the way out
    import_hf(src, tmp_path / "out.safetensors", tokenizer=tmp_path / "ours.json")

    with pytest.raises(EulerError, match="already exists"):
        import_hf(exported, tmp_path / "out.safetensors")
    with pytest.raises(EulerError, match="already exists"):
        export_hf(model[0], exported)


def test_failed_export_keeps_the_previous_folder(model, exported, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "generation_config.json").write_text("old")  # marks the previous export
    import euler.interop.hf_export as hf_export

    real = hf_export.os.replace

    def fail_on_the_new_folder(a, b):
        if str(a).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(hf_export.os, "replace", fail_on_the_new_folder)
    with pytest.raises(EulerError, match="No space left on device; the previous folder is kept"):
        export_hf(model[0], out, overwrite=True)
    assert (out / "generation_config.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_cli_export_import_and_one_line_error(model, tmp_path, monkeypatch, capsys):
    from euler.cli.main import main

    def euler(*args):
        monkeypatch.setattr("sys.argv", ["euler", *map(str, args)])
        try:
            main()
        except SystemExit as e:
            return e.code
        return 0

    assert (
        euler("export", "--format", "hf", "--checkpoint", model[0], "--out", tmp_path / "hf") == 0
    )
    (tmp_path / "hf" / SIDE_FILE).unlink()
    out = tmp_path / "back.safetensors"
    assert euler("import", "--format", "hf", tmp_path / "hf", "--out", out, "--n-mtp", "2") == 0
    printed = capsys.readouterr().out
    assert "note: no mtp_heads.safetensors: MTP heads 1..1 are freshly initialised" in printed
    assert ckpt.load(out).cfg.n_mtp == 2
    assert euler("export", "--format", "gguf", "--checkpoint", model[0], "--out", tmp_path) == 2
    assert capsys.readouterr().err == "error: --format gguf: export writes hf folders only\n"
    assert euler("export", "--format", "onnx", "--checkpoint", model[0], "--out", tmp_path) == 2
    assert capsys.readouterr().err == "error: --format: unknown format 'onnx' (known: hf, gguf)\n"


def test_eval_text_equals_transformers(model, exported, tmp_path):
    """`euler eval --text`'s bits per byte, recomputed from transformers' logits over the
    same windows (T + 1 tokens at stride T, the tail window shorter)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from euler.cpu.backend import CpuBackend
    from euler.eval.text import evaluate_text, load_text

    (tmp_path / "t.txt").write_text(TEXT * 7, encoding="utf-8")
    ck = ckpt.load(model[0])
    sources = load_text([tmp_path / "t.txt"], ck)
    ours = evaluate_text(ck, sources, CpuBackend())["overall"]
    stream, T = sources[0].streams[0], ck.cfg.context
    assert len(stream) % T > 1  # a shorter last window is scored too
    hf = transformers.LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    nats, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(stream) - 1, T):
            w = torch.tensor(stream[s : s + T + 1], dtype=torch.long)
            logits = hf(w[None, :-1]).logits[0].double()
            nats += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
            n += len(w) - 1
    assert ours["tokens"] == n == len(stream) - 1
    assert ours["bytes"] == len((TEXT * 7).strip().encode("utf-8"))
    theirs = nats / np.log(2) / ours["bytes"]
    assert ours["bits_per_byte"] == pytest.approx(theirs, rel=2e-6)
