"""Export a checkpoint as a Hugging Face Llama folder (`LlamaForCausalLM`).

Our block is Llama's block, so the export is a renaming, not a conversion:

    tok_emb (V, D)                     model.embed_tokens.weight
    layers.l.attn.wq|wk|wv|wo          model.layers.l.self_attn.q_proj|k_proj|v_proj|o_proj.weight
    layers.l.mlp.w_gate|w_up|w_down    model.layers.l.mlp.gate_proj|up_proj|down_proj.weight
    layers.l.attn_norm, mlp_norm (D,)  model.layers.l.input_layernorm, post_attention_layernorm
    final_norm (D,)                    model.norm.weight
    head 0 (V, D)                      lm_head.weight (none when tied: tie_word_embeddings true)
    heads 1..K-1                       mtp_heads.safetensors (side file: `mtp_heads.k`, (V, D))

Both sides store linear weights (out, in) and both rotate halves in RoPE (see
tests/numpy_reference.py), so q_proj and k_proj rows keep their order; tests/test_interop.py
checks that by comparing logits with `transformers`. Tensors stay float32, bit for bit.

The folder is written whole or not at all: every file goes to a temporary sibling folder,
which is then renamed to the target.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save as st_save

from euler import ownership
from euler.data.files import default_mode, output_lock
from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights

WEIGHTS = "model.safetensors"
SIDE_FILE = "mtp_heads.safetensors"
SIDE_FORMAT = "nanoeuler-mtp-heads"

# our per-layer name suffix -> Hugging Face's, under layers.{l}. / model.layers.{l}.
LAYER_NAMES = {
    "attn.wq": "self_attn.q_proj.weight",
    "attn.wk": "self_attn.k_proj.weight",
    "attn.wv": "self_attn.v_proj.weight",
    "attn.wo": "self_attn.o_proj.weight",
    "mlp.w_gate": "mlp.gate_proj.weight",
    "mlp.w_up": "mlp.up_proj.weight",
    "mlp.w_down": "mlp.down_proj.weight",
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
}
TOP_NAMES = {"tok_emb": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}
HEAD = "lm_head.weight"

# <|user|> PROMPT <|end|> <|assistant|> RESPONSE <|end|>, as in euler/data/chat_template.py
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] | trim }}"
    "<|end|><|assistant|>{% elif m['role'] == 'assistant' %}{{ m['content'] | trim }}<|end|>"
    "{% endif %}{% endfor %}"
)


def hf_name(name: str) -> str:
    """Hugging Face tensor name of one of our param_table names other than mtp_heads."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, layer, suffix = name.split(".", 2)
    return f"model.layers.{layer}.{LAYER_NAMES[suffix]}"


def hf_config(cfg: ModelConfig, special: dict[str, int]) -> dict:
    """config.json for LlamaForCausalLM; `special` maps our special-token text to ids."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_size,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": cfg.norm_eps,
        # both spellings: transformers 4.x reads rope_theta, 5.x rope_parameters
        "rope_theta": cfg.rope_base,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rope_scaling": None,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": special["<|endoftext|>"],
        "eos_token_id": [special["<|end|>"], special["<|endoftext|>"]],
        "pad_token_id": special["<|endoftext|>"],
        "torch_dtype": "float32",
        "use_cache": True,
    }


def hf_files(
    cfg: ModelConfig, params: np.ndarray, hf_tokenizer_json: str, special: dict[str, int],
    chat: tuple[str, str, str] | None = None,
) -> dict[str, bytes]:  # fmt: skip
    """File name -> bytes of the export of flat parameters params (P,) float32.

    chat: (document separator text, end-of-answer text, Jinja chat template) of a foreign
    tokenizer (an imported model); default ours. `special` maps both texts to ids."""
    eot, end, template = chat or ("<|endoftext|>", "<|end|>", CHAT_TEMPLATE)
    special = {**special, "<|endoftext|>": special[eot], "<|end|>": special[end]}
    views = ParamLayout(cfg).views(np.ascontiguousarray(params, dtype=np.float32))
    tensors = {
        hf_name(name): np.ascontiguousarray(views[name])
        for name, _, _ in ParamLayout(cfg).table
        if name != "mtp_heads"
    }
    heads = head_weights(cfg, views)  # K of (V, D); head 0 is tok_emb when tied
    if not cfg.tie_embeddings:  # tied: transformers reads embed_tokens as lm_head
        tensors[HEAD] = np.ascontiguousarray(heads[0])
    side = {f"mtp_heads.{k}": np.ascontiguousarray(heads[k]) for k in range(1, cfg.n_mtp)}
    eos = [special["<|end|>"], special["<|endoftext|>"]]
    generation = {
        "bos_token_id": special["<|endoftext|>"],
        "eos_token_id": eos,
        "pad_token_id": special["<|endoftext|>"],
        "do_sample": False,
    }
    # the class keeps AutoTokenizer from guessing a Llama tokenizer from config.json (those
    # add a BOS token by default); the specials and template make chat prompts ours
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": end,
        "pad_token": eot,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": cfg.context,
        "chat_template": template,
    }
    text = lambda d: (json.dumps(d, indent=2) + "\n").encode()
    return {
        "config.json": text(hf_config(cfg, special)),
        WEIGHTS: st_save(tensors, metadata={"format": "pt"}),
        # one metadata key: safetensors writes several in no fixed order, and exports should
        # be byte-identical; K is the number of tensors + 1
        SIDE_FILE: st_save(side, metadata={"format": SIDE_FORMAT}),
        "tokenizer.json": hf_tokenizer_json.encode(),
        "tokenizer_config.json": text(tokenizer_config),
        "generation_config.json": text(generation),
    }


def write_folder(out: Path, files: dict[str, bytes], overwrite: bool, source: Path) -> None:
    """Write `files` as the folder `out`, all or nothing (temporary sibling, then rename).

    An existing `out` is replaced only with `overwrite`, only if it holds nothing but an
    earlier export's files, and never if it holds `source` (the file being exported).
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise EulerError(f"--out: the folder's parent does not exist: {out.parent}")
    with output_lock(out):  # one writer at a time; the rule checked under the lock
        _write_folder(out, files, overwrite, source)


def _write_folder(out: Path, files: dict[str, bytes], overwrite: bool, source: Path) -> None:
    ownership.claim_folder(out, ownership.EXPORT, overwrite, [("--checkpoint", Path(source))])
    foreign = sorted(p.name for p in out.iterdir() if p.name not in files) if out.exists() else []
    if foreign:
        raise EulerError(
            f"--out {out} holds {foreign[0]}, which no export writes; --overwrite replaces "
            "only an earlier export"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    old = tmp.with_suffix(".old")  # where a replaced folder waits until the new one is in
    try:
        tmp.chmod(default_mode(directory=True))  # mkdtemp's is private; an export is not
        for name, data in files.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        if out.exists():  # a rename cannot replace a non-empty folder: move the old one aside
            os.replace(out, old)
        os.replace(tmp, out)
    except OSError as e:
        if old.exists() and not out.exists():
            os.replace(old, out)
        shutil.rmtree(tmp, ignore_errors=True)
        kept = "the previous folder is kept" if out.exists() else "nothing was written"
        raise EulerError(f"could not write {out}: {e.strerror or e}; {kept}") from None
    shutil.rmtree(old, ignore_errors=True)


def export_hf(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write the checkpoint (file or run folder) as a Hugging Face Llama folder `out`."""
    from euler.training import checkpoint as ckpt

    ck = ckpt.load(checkpoint, np.float32)
    tok = ck.tokenizer()
    if tok.vocab_size > ck.cfg.vocab_size:
        raise EulerError(
            f"{ck.path}: tokenizer has {tok.vocab_size} ids but vocab_size is {ck.cfg.vocab_size}"
        )
    chat = None
    if hasattr(tok, "chat_spec"):  # an imported model's tokenizer: its texts and template
        spec = tok.chat_spec or {}
        eot, end = tok.token_bytes(tok.eot_id).decode(), tok.token_bytes(tok.end_id).decode()
        chat = (eot, end, spec.get("template") or "")
        special = {**tok.special, eot: tok.eot_id, end: tok.end_id}
    else:
        special = tok.special
    files = hf_files(ck.cfg, ck.params, tok.to_hf_json(), special, chat)
    write_folder(Path(out), files, overwrite, ck.path)
    return Path(out)
