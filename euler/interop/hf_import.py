"""Import a Hugging Face Llama folder as a NanoEuler checkpoint (the reverse of hf_export).

Accepted: a `LlamaForCausalLM` whose architecture our ModelConfig expresses: no biases, SiLU,
plain RoPE (no scaling, full rotary width), no sliding window, head_dim = hidden/heads, an
untied lm_head; weights in model.safetensors or shards listed in
model.safetensors.index.json, as float32, float16 or bfloat16 (widened to float32, exactly).
Anything else is refused in one line naming the field or tensor.

MTP heads: lm_head becomes head 0. With our side file (mtp_heads.safetensors) heads
1..K-1 come back bit for bit; without it the model gets K = n_mtp heads, 1..K-1 freshly
initialised (the caller is told).

Tokenizer: tokenizer.json is taken only if it is exactly one of ours (bytes at ids 0..255,
our special tokens at 256..259, merge r making id 260 + r, our pretokenizer); any other
needs one of our tokenizer files given explicitly.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from euler.errors import EulerError
from euler.interop.hf_export import HEAD, SIDE_FILE, SIDE_FORMAT, WEIGHTS, hf_name
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, init_params
from euler.training import checkpoint as ckpt

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # all widen to float32 exactly


def _field(c: dict, name: str, default=None, required: bool = False):
    if name not in c or c[name] is None:
        if required:
            raise EulerError(f"config.json: missing field {name}")
        return default
    return c[name]


def config_from_hf(c: dict, n_mtp: int = 1) -> ModelConfig:
    """ModelConfig for a Llama config.json dict; EulerError naming the first field we cannot
    express."""
    if c.get("model_type") != "llama":
        raise EulerError(f"config.json: model_type is {c.get('model_type')!r}, not 'llama'")
    for name, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if _field(c, name, ok) != ok:
            raise EulerError(f"config.json: {name} is {c[name]!r}; NanoEuler needs {ok!r}")
    for name in ("rope_scaling", "sliding_window", "use_sliding_window", "layer_types"):
        if c.get(name):
            raise EulerError(f"config.json: {name} is set; NanoEuler has plain RoPE everywhere")
    rope = _field(c, "rope_parameters", {})
    if rope.get("rope_type", "default") != "default":
        raise EulerError(f"config.json: rope_parameters.rope_type is {rope['rope_type']!r}")
    for where in (c, rope):
        if where.get("partial_rotary_factor", 1.0) != 1.0:
            raise EulerError("config.json: partial_rotary_factor is not 1 (partial RoPE)")
    hidden = _field(c, "hidden_size", required=True)
    heads = _field(c, "num_attention_heads", required=True)
    head_dim = _field(c, "head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise EulerError(
            f"config.json: head_dim {head_dim} x {heads} heads != hidden_size {hidden}"
        )
    ffn = _field(c, "intermediate_size", required=True)
    if not isinstance(ffn, int) or ffn < 1:  # our 0 would mean "the default width"
        raise EulerError(f"config.json: intermediate_size must be positive, got {ffn!r}")
    try:
        return ModelConfig(
            vocab_size=_field(c, "vocab_size", required=True),
            d_model=hidden,
            n_head=heads,
            n_kv_head=_field(c, "num_key_value_heads", heads),
            n_layer=_field(c, "num_hidden_layers", required=True),
            context=_field(c, "max_position_embeddings", required=True),
            n_mtp=n_mtp,
            # defaults as transformers' LlamaConfig
            rope_base=float(rope.get("rope_theta", _field(c, "rope_theta", 10000.0))),
            norm_eps=float(_field(c, "rms_norm_eps", 1e-6)),
            ffn_hidden=ffn,
            init_std=float(_field(c, "initializer_range", 0.02)),
        )
    except EulerError as e:
        raise EulerError(f"config.json: {e}") from None


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (bfloat16 widened by hand: NumPy has
    no bfloat16, so safetensors.numpy cannot load it)."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        (n,) = struct.unpack("<Q", data[:8].tobytes())
        header = json.loads(data[8 : 8 + n].tobytes())
    except (OSError, ValueError, struct.error) as e:
        raise EulerError(f"{path}: not a readable safetensors file ({e})") from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise EulerError(f"{path}: tensor {name} has dtype {info.get('dtype')}")
        begin, end = (8 + n + o for o in info["data_offsets"])
        if end > data.size:
            raise EulerError(f"{path}: truncated (tensor {name} runs past the end)")
        try:
            a = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
        except ValueError:
            raise EulerError(f"{path}: tensor {name}'s bytes do not fit its shape") from None
        if info["dtype"] == "BF16":  # bfloat16 is the top half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32)
    return out


def read_weights(src: Path) -> dict[str, np.ndarray]:
    """All tensors of model.safetensors, or of the shards model.safetensors.index.json names."""
    index = src / (WEIGHTS + ".index.json")
    if (src / WEIGHTS).is_file():
        return read_safetensors(src / WEIGHTS)
    if not index.is_file():
        raise EulerError(f"{src}: no {WEIGHTS} (nor {index.name}); pytorch .bin files are pickle")
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        tensors.update(read_safetensors(src / shard))
    return tensors


def tokenizer_from_hf(doc: dict, where: Path) -> Tokenizer:
    """Our Tokenizer for a Hugging Face tokenizer.json dict that is one of ours."""
    from euler.tokenizer import SPECIAL_TOKENS, Tokenizer

    first = 256 + len(SPECIAL_TOKENS)
    foreign = f"{where}: not a NanoEuler byte-level BPE tokenizer"
    model = doc.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        raise EulerError(f"{foreign} (model is not BPE)")
    names = [m.split(" ") if isinstance(m, str) else m for m in merges]  # "a b" or ["a", "b"]
    pairs = []
    for r, pair in enumerate(names):
        ids = [vocab.get(x) for x in pair] if len(pair) == 2 else [None]
        if not all(isinstance(i, int) and (i < 256 or first <= i < first + r) for i in ids):
            raise EulerError(f"{foreign} (merge {r} {pair!r} is not of earlier plain tokens)")
        pairs.append(ids)
    tok = Tokenizer(pairs)
    ours = json.loads(tok.to_hf_json())
    added = lambda d: {t.get("content"): t.get("id") for t in d.get("added_tokens") or []}
    checks = {
        "model.vocab": (vocab, ours["model"]["vocab"]),
        "model.merges": (names, [m.split(" ") for m in ours["model"]["merges"]]),
        "added_tokens": (added(doc), added(ours)),
    }
    for section in ("normalizer", "pre_tokenizer"):
        checks[section] = (doc.get(section), ours[section])
    checks["post_processor"] = (_adds_nothing(doc.get("post_processor")), True)
    for section, (theirs, want) in checks.items():
        if theirs != want:
            raise EulerError(f"{foreign} ({section} differs); give --tokenizer")
    return tok


def _adds_nothing(post: dict | None) -> bool:
    """Whether a post_processor leaves a single text's ids as they are (transformers 5 saves
    one that only passes the sequence through)."""
    if post is None:
        return True
    passthrough = [{"Sequence": {"id": "A", "type_id": 0}}]
    return post.get("type") == "TemplateProcessing" and post.get("single") == passthrough


def import_hf(
    src: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    n_mtp: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> tuple[Path, ModelConfig, list[str]]:
    """Write a NanoEuler checkpoint for the Hugging Face Llama folder src.

    tokenizer: one of our tokenizer files, used instead of src/tokenizer.json. n_mtp: the
    number of heads K when src has no side file (default 1). Returns (checkpoint path,
    config, notes for the user).
    """
    src, notes = Path(src), []
    if not src.is_dir():
        raise EulerError(f"not a folder: {src}")
    out = Path(out)
    out = out / ckpt.CHECKPOINT_NAME if out.is_dir() else out
    if out.exists() and not overwrite:
        raise EulerError(f"{out} already exists (use --overwrite to replace it)")
    if not out.parent.is_dir():
        raise EulerError(f"output folder does not exist: {out.parent}")
    try:
        c = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EulerError(f"{src / 'config.json'}: cannot read ({e})") from None
    tok = _tokenizer(src, tokenizer)
    tensors = read_weights(src)
    side = src / SIDE_FILE
    heads = [tensors.pop(HEAD, None)]
    if side.is_file():
        extra = read_safetensors(side)
        k = len(extra) + 1
        if n_mtp not in (None, k):
            raise EulerError(f"--n-mtp {n_mtp}, but {side} holds {k} heads")
        heads += [extra.get(f"mtp_heads.{i}") for i in range(1, k)]
        if any(h is None for h in heads[1:]):
            raise EulerError(f"{side}: not a {SIDE_FORMAT} file (heads 1..{k - 1} expected)")
    cfg = config_from_hf(c, len(heads) if side.is_file() else n_mtp or 1)
    # a tied head is refused unless the folder also holds it (a tied save drops lm_head)
    tied = c.get("tie_word_embeddings", False)
    if tied and not np.array_equal(heads[0], tensors.get(hf_name("tok_emb"))):
        raise EulerError("config.json: tie_word_embeddings is true; NanoEuler needs an lm_head")
    if heads[0] is None:
        raise EulerError(f"{src}: tensor {HEAD} is missing")
    if tok.vocab_size > cfg.vocab_size:
        raise EulerError(f"tokenizer has {tok.vocab_size} ids, the model only {cfg.vocab_size}")
    layout = ParamLayout(cfg)
    params = init_params(layout, seed)  # only heads 1..K-1 keep these values, if unsaved
    views = layout.views(params)
    for name, shape, _ in layout.table:
        if name == "mtp_heads":
            continue
        t = tensors.pop(hf_name(name), None)
        if t is None or t.shape != shape:
            got = "missing" if t is None else f"shape {t.shape}"
            raise EulerError(f"{src}: tensor {hf_name(name)} is {got}; config needs {shape}")
        views[name][...] = t
    if tensors:
        raise EulerError(
            f"{src}: unexpected tensor {sorted(tensors)[0]}: our block has no such weight"
        )
    for k, h in enumerate(heads):
        if h.shape != views["mtp_heads"].shape[1:]:
            raise EulerError(f"{src}: head {k} has shape {h.shape}, config needs (V, D)")
        views["mtp_heads"][k] = h
    if cfg.n_mtp > len(heads):
        notes.append(
            f"no {SIDE_FILE}: MTP heads 1..{cfg.n_mtp - 1} are freshly initialised "
            f"(seed {seed}); train them before speculative decoding"
        )
    ckpt.save(out, cfg, params, None, {}, {"imported_from": str(src)}, tok.to_json())
    return out, cfg, notes


def _tokenizer(src: Path, path: str | Path | None) -> Tokenizer:
    """The Tokenizer of our file `path`, else of src/tokenizer.json if that is one of ours."""
    from euler.tokenizer import Tokenizer

    if path is not None:
        return Tokenizer.load(path)
    hf = src / "tokenizer.json"
    try:
        doc = json.loads(hf.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EulerError(f"{hf}: cannot read ({e}); give --tokenizer") from None
    return tokenizer_from_hf(doc, hf)
