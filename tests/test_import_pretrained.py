"""Someone else's model imported: a tiny tied Llama made by transformers inside the test.

Nothing is downloaded. transformers builds a LlamaForCausalLM with tied embeddings and random
weights; `tokenizers` trains a byte-level BPE (SmolLM2's Digits-then-ByteLevel pre-tokenizer,
ChatML specials) with SmolLM2's chat template. The model is saved as a Hugging Face folder and,
with the `gguf` writer, as GGUF files in F32, F16, BF16, Q8_0, Q4_0 and Q4_1 (q and k rows
permuted as llama.cpp's converter does). Each is imported with `euler import`; our CPU fp32
logits must equal transformers' (from the folder, and from the same GGUF file, which
transformers dequantizes with gguf too) within 1e-4 relative to the largest logit, the
tokenizer must give `tokenizers`' ids, ChatML prompts must equal apply_chat_template's, and
greedy chat must give transformers' `generate` tokens.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from euler.cli.main import main as euler_main  # noqa: E402
from euler.tokenizer import HFByteLevelBPE  # noqa: E402

from euler.data.chat_template import encode_prompt  # noqa: E402
from euler.errors import EulerError  # noqa: E402
from euler.inference.generate import ChatSession, Decoder  # noqa: E402
from euler.inference.sampling import SamplingConfig  # noqa: E402
from euler.interop.gguf_import import import_gguf  # noqa: E402
from euler.interop.hf_import import import_hf  # noqa: E402
from euler.model.transformer import Model  # noqa: E402
from euler.training import checkpoint as ckpt  # noqa: E402

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QUANTS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
TOL = 1e-4  # relative to the largest |logit|; float32 reassociation gives about 1e-6


def _text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    words = "the capital of France is Paris and 1999 it's we'll naïve café — “x” (y) a".split()
    seps = [" ", " ", " ", ", ", ".\n", "\n\n", "  "]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tied Llama with random weights and a ChatML byte-level BPE, saved by transformers."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator([_text(0, 20000)], trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>",
    )  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights off 1, so that a norm that drops them shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.rand_like(p) * 0.6 - 0.3)
    model.save_pretrained(out)
    return out, model, fast


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (halves -> adjacent pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _write_gguf(path, model, fast, quant: str) -> None:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    doc = json.loads(fast.backend_tokenizer.to_str())
    vocab = doc["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"embed_tokens": "token_embd", "norm": "output_norm"}
    per_layer = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    qtype = gguf.GGMLQuantizationType[quant]
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: llama.cpp reads token_embd
        a = p.numpy().astype(np.float32)
        parts = name.removeprefix("model.").removesuffix(".weight").split(".")
        if parts[0] == "layers":
            gname = f"blk.{parts[1]}.{per_layer['.'.join(parts[2:])]}.weight"
            if parts[-1] == "q_proj":
                a = _permute(a, cfg.num_attention_heads)
            elif parts[-1] == "k_proj":
                a = _permute(a, cfg.num_key_value_heads)
        else:
            gname = names[parts[0]] + ".weight"
        if a.ndim == 1 or quant == "F32":
            w.add_tensor(gname, a)
        elif quant == "F16":
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def euler_cli(monkeypatch):
    """euler(*args) -> exit status, run in this process."""

    def run(*args) -> int:
        monkeypatch.setattr("sys.argv", ["euler", *map(str, args)])
        try:
            euler_main()
        except SystemExit as e:
            return e.code
        return 0

    return run


def _our_logits(path, ids: np.ndarray) -> np.ndarray:
    ck = ckpt.load(path)
    model = Model(ck.cfg, flat_params=ck.params)
    model.forward(ids[None])
    return model.head_logits(0)[0]


def _assert_logits(ours: np.ndarray, theirs: np.ndarray) -> None:
    err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    assert err <= TOL, f"max |ours - transformers| / max |logit| = {err:.2e}"


def _ids(model) -> np.ndarray:
    """(64,) int32 random ids of the model's vocabulary: the logits' input."""
    return np.random.default_rng(0).integers(0, model.config.vocab_size, 64).astype(np.int32)


def test_hf_folder_imports_tied_with_its_tokenizer_and_template(
    folder, tmp_path, euler_cli
) -> None:
    src, model, fast = folder
    ids_in = _ids(model)
    out, cfg, _ = import_hf(src, tmp_path / "tiny.safetensors")
    assert cfg.tie_embeddings and cfg.n_mtp == 1 and cfg.rope_base == 100000.0
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids_in[None]).long()).logits[0].numpy()
    _assert_logits(_our_logits(out, ids_in), theirs)

    tok = ckpt.load(out).tokenizer()
    assert isinstance(tok, HFByteLevelBPE) and tok.chat_spec["system"] == SYSTEM
    text = _text(7, 800) + "<|im_start|>user\n12 apples<|im_end|>"
    assert tok.encode(text, allow_special=True).tolist() == fast(text)["input_ids"]
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    want = fast.apply_chat_template(turn, add_generation_prompt=True, return_dict=True)
    want = want["input_ids"]
    assert encode_prompt(tok, "What is the capital of France?").tolist() == list(want)
    # a tied export goes back out with tie_word_embeddings and no lm_head
    assert euler_cli("export", "--checkpoint", out, "--out", tmp_path / "hf") == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] is True


def test_greedy_chat_equals_transformers_generate(folder, tmp_path) -> None:
    src, model, fast = folder
    out, _, _ = import_hf(src, tmp_path / "tiny.safetensors")
    ck = ckpt.load(out)
    tok = ck.tokenizer()
    session = ChatSession(Decoder(ck.cfg, ck.params), tok)
    res, _ = session.reply(
        "Name a city.", 12, SamplingConfig(0.0, 0, 1.0), np.random.default_rng(0)
    )
    turn = [{"role": "user", "content": "Name a city."}]
    ids = fast.apply_chat_template(turn, add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True)["input_ids"]  # fmt: skip
    gen = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.end_id,
                         pad_token_id=tok.end_id)[0, ids.shape[1] :].tolist()  # fmt: skip
    if tok.end_id in gen:  # ours stops before the end token, generate keeps it
        gen = gen[: gen.index(tok.end_id)]
    assert res.tokens == gen


@pytest.mark.parametrize("quant", QUANTS)
def test_gguf_imports_equal_transformers_from_the_same_file(folder, tmp_path, quant) -> None:
    src, model, fast = folder
    ids_in = _ids(model)
    path = tmp_path / f"tiny-{quant}.gguf"
    _write_gguf(path, model, fast, quant)
    out, cfg, notes = import_gguf(path, tmp_path / "tiny.safetensors")
    assert cfg.tie_embeddings and cfg.context == 256 and cfg.norm_eps == pytest.approx(1e-5)
    assert quant in notes[0] or quant == "F32"
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        theirs = theirs_model(torch.from_numpy(ids_in[None]).long()).logits[0].numpy()
    _assert_logits(_our_logits(out, ids_in), theirs)
    if quant == "F32":  # unquantized: the same numbers as the folder's model too
        with torch.no_grad():
            folder_logits = model(torch.from_numpy(ids_in[None]).long()).logits[0].numpy()
        _assert_logits(_our_logits(out, ids_in), folder_logits)
    # the GGUF's tokenizer fields give the folder's tokenizer's ids
    text = _text(9, 500)
    assert ckpt.load(out).tokenizer().encode(text).tolist() == fast(text)["input_ids"]


def test_gguf_cli_context_and_refusals(folder, tmp_path, capsys, euler_cli) -> None:
    src, model, fast = folder
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, model, fast, "Q8_0")
    out = tmp_path / "run.safetensors"
    argv = ["import", "--format", "gguf", path, "--out", out, "--context", "32"]
    assert euler_cli(*argv) == 0
    assert "tied embeddings, context 32" in capsys.readouterr().out
    assert ckpt.load(out).cfg.context == 32
    assert euler_cli(*argv) == 2  # exists, no --overwrite
    assert capsys.readouterr().err.count("\n") == 1
    # --out without .safetensors is a run folder, made as euler train makes one
    run = tmp_path / "runs" / "smol"
    assert euler_cli("import", "--format", "gguf", path, "--out", run) == 0
    assert f"wrote {run / ckpt.CHECKPOINT_NAME}" in capsys.readouterr().out
    assert ckpt.load(run / ckpt.CHECKPOINT_NAME).cfg.tie_embeddings
    assert euler_cli("import", "--format", "gguf", path, "--out", run) == 2  # no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    assert euler_cli("import", "--format", "gguf", bad, "--out", tmp_path / "x") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a readable GGUF file") and err.count("\n") == 1
    # a metadata value our config cannot express, named
    w = gguf.GGUFWriter(str(tmp_path / "scaled.gguf"), "llama")
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(EulerError, match=r"llama.rope.scaling.type is 'linear'"):
        import_gguf(tmp_path / "scaled.gguf", tmp_path / "y.safetensors")
