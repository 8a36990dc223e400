"""Import a Hugging Face Llama folder as a NanoEuler checkpoint (the reverse of hf_export).

Accepted: a `LlamaForCausalLM` whose architecture our ModelConfig expresses: no biases, SiLU,
plain RoPE (no scaling, full rotary width), no sliding window, head_dim = hidden/heads, an
lm_head or tied embeddings (tie_word_embeddings; then head 0 is the embedding); weights in
model.safetensors or shards listed in model.safetensors.index.json, as float32, float16 or
bfloat16 (widened to float32, exactly).
Anything else is refused in one line naming the field or tensor.

MTP heads: lm_head becomes head 0. With our side file (mtp_heads.safetensors) heads
1..K-1 come back bit for bit; without it the model gets K = n_mtp heads, 1..K-1 freshly
initialised (the caller is told).

Tokenizer: tokenizer.json becomes our Tokenizer if it is exactly one of ours (bytes at ids
0..255, our special tokens at 256..259, merge r making id 260 + r, our pretokenizer), else
someone else's byte-level BPE (euler.tokenizer.HFByteLevelBPE) with the folder's chat
template (tokenizer_config.json's chat_template, or chat_template.jinja; ChatML is rendered);
--tokenizer names a tokenizer file instead.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from euler import ownership
from euler.errors import EulerError
from euler.interop.hf_export import HEAD, SIDE_FILE, SIDE_FORMAT, WEIGHTS, hf_name
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights, init_params
from euler.schema import MISSING, Fields, parse_json, read_json
from euler.training import checkpoint as ckpt

if TYPE_CHECKING:
    from euler.tokenizer import HFByteLevelBPE, Tokenizer

_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # all widen to float32 exactly


def config_from_hf(c: Fields, n_mtp: int = 1) -> ModelConfig:
    """ModelConfig for a Llama config.json; EulerError naming the first field we cannot
    express or whose value has the wrong type."""
    if c.get("model_type", None) != "llama":
        c.fail("model_type", "'llama'", c.get("model_type", MISSING))
    for name, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if c.get(name, ok) not in (ok, None):
            c.fail(name, f"{ok!r} (NanoEuler's block)", c.get(name))
    for name in ("rope_scaling", "sliding_window", "use_sliding_window", "layer_types"):
        if c.get(name, None):
            raise EulerError(f"{c.where}: {name} is set; NanoEuler has plain RoPE everywhere")
    rope = c.obj("rope_parameters") if c.get("rope_parameters", None) is not None else None
    if rope is not None and rope.get("rope_type", "default") != "default":
        rope.fail("rope_type", "'default'", rope.get("rope_type"))
    for where in (c, rope):
        if where is not None and where.get("partial_rotary_factor", 1.0) != 1.0:
            where.fail("partial_rotary_factor", "1 (NanoEuler rotates the whole head)",
                       where.get("partial_rotary_factor"))  # fmt: skip
    hidden = c.int("hidden_size", lo=1)
    heads = c.int("num_attention_heads", lo=1)
    head_dim = c.int("head_dim", lo=1) if c.get("head_dim", None) is not None else None
    if head_dim is not None and head_dim * heads != hidden:
        raise EulerError(f"{c.where}: head_dim {head_dim} x {heads} heads != hidden_size {hidden}")
    given = c.get("num_key_value_heads", None) is not None  # 0 is refused, not read as absent
    kv = c.int("num_key_value_heads", lo=1) if given else heads
    theta = 10000.0  # defaults as transformers' LlamaConfig
    if rope is not None and rope.has("rope_theta"):
        theta = rope.float("rope_theta")
    elif c.get("rope_theta", None) is not None:
        theta = c.float("rope_theta")
    optional = lambda key, default: c.float(key) if c.get(key, None) is not None else default
    try:
        return ModelConfig(
            vocab_size=c.int("vocab_size", lo=1),
            d_model=hidden,
            n_head=heads,
            n_kv_head=kv,
            n_layer=c.int("num_hidden_layers", lo=1),
            context=c.int("max_position_embeddings", lo=1),
            n_mtp=n_mtp,
            rope_base=theta,
            norm_eps=optional("rms_norm_eps", 1e-6),
            ffn_hidden=c.int("intermediate_size", lo=1),  # our 0 would mean "the default"
            init_std=optional("initializer_range", 0.02),
        )
    except EulerError as e:
        raise EulerError(f"{c.where}: {e}") from None


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (bfloat16 widened by hand: NumPy has
    no bfloat16, so safetensors.numpy cannot load it). The header is checked against the
    file's size before any tensor is read."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise EulerError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if data.size < 10:
        raise EulerError(f"{path}: not a safetensors file ({data.size} bytes)")
    (n,) = struct.unpack("<Q", data[:8].tobytes())
    if n > data.size - 8 or data[8] != ord("{"):
        raise EulerError(f"{path}: not a safetensors file (its header length or start is wrong)")
    where = f"{path} header"
    header = Fields(parse_json(data[8 : 8 + n].tobytes(), where), where)
    out = {}
    for name in header.data:
        if name == "__metadata__":
            continue
        info = header.obj(name)
        dtype = _DTYPES.get(info.str("dtype"))
        if dtype is None:
            info.fail("dtype", "F32, F16 or BF16", info.get("dtype"))
        shape = info.list("shape")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            info.fail("shape", "a list of sizes", shape)
        offsets = info.list("data_offsets")
        if len(offsets) != 2 or not all(isinstance(o, int) and o >= 0 for o in offsets):
            info.fail("data_offsets", "[begin, end]", offsets)
        begin, end = (8 + n + o for o in offsets)
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if end > data.size:
            raise EulerError(f"{path}: truncated (tensor {name} runs past the end)")
        if end - begin != size:
            raise EulerError(f"{path}: tensor {name}'s {end - begin} bytes do not fit {shape}")
        a = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
        if info.get("dtype") == "BF16":  # bfloat16 is the top half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        a = a.astype(np.float32)
        if not np.isfinite(a).all():
            raise EulerError(f"{path}: tensor {name} holds non-finite values (NaN or inf)")
        out[name] = a
    return out


def read_weights(src: Path) -> dict[str, np.ndarray]:
    """All tensors of model.safetensors, or of the shards model.safetensors.index.json names
    (each a file name inside src)."""
    index = src / (WEIGHTS + ".index.json")
    if (src / WEIGHTS).is_file():
        return read_safetensors(src / WEIGHTS)
    if not index.is_file():
        raise EulerError(f"{src}: no {WEIGHTS} (nor {index.name}); pytorch .bin files are pickle")
    weight_map = Fields(read_json(index, "weights index"), str(index)).obj("weight_map")
    shards = set()
    for tensor in weight_map.data:
        shard = weight_map.str(tensor)
        if Path(shard).name != shard or shard in ("", ".", ".."):
            weight_map.fail(tensor, "a file name inside the folder", shard)
        shards.add(shard)
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(shards):
        if not (src / shard).is_file():
            raise EulerError(f"{index}: names {shard}, which is not in {src}")
        tensors.update(read_safetensors(src / shard))
    return tensors


def tokenizer_from_hf(doc: dict, where: Path) -> Tokenizer:
    """Our Tokenizer for a Hugging Face tokenizer.json dict that is one of ours."""
    from euler.tokenizer import SPECIAL_TOKENS, Tokenizer

    first = 256 + len(SPECIAL_TOKENS)
    foreign = f"{where}: not a NanoEuler byte-level BPE tokenizer"
    model = doc.get("model") if isinstance(doc, dict) else None
    model = model if isinstance(model, dict) else {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        raise EulerError(f"{foreign} (model is not BPE)")
    names = [m.split(" ") if isinstance(m, str) else m for m in merges]  # "a b" or ["a", "b"]
    pairs = []
    for r, pair in enumerate(names):
        plain = isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ids = [vocab.get(x) for x in pair] if plain else [None]
        if not all(isinstance(i, int) and (i < 256 or first <= i < first + r) for i in ids):
            raise EulerError(f"{foreign} (merge {r} {pair!r} is not of earlier plain tokens)")
        pairs.append(ids)
    tok = Tokenizer(pairs)
    ours = json.loads(tok.to_hf_json())
    added = lambda d: sorted(
        (str(t.get("content")), str(t.get("id"))) if isinstance(t, dict) else ("?", str(t))
        for t in (d.get("added_tokens") if isinstance(d.get("added_tokens"), list) else [])
    )
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
    if not isinstance(post, dict):
        return False
    passthrough = [{"Sequence": {"id": "A", "type_id": 0}}]
    return post.get("type") == "TemplateProcessing" and post.get("single") == passthrough


def claim_checkpoint(out: Path, overwrite: bool, reads: list) -> Path:
    """The checkpoint path an import writes for --out, claimed by euler.ownership's rule.

    A `.safetensors` path (or an existing file) is the checkpoint itself; any other path is
    a run folder, made if absent as `euler train --out` makes one, that will hold
    checkpoint.safetensors. reads: (flag, path) pairs the import reads, never replaced.
    """
    if out.is_dir() or (not out.exists() and out.suffix != ".safetensors"):
        out = out / ckpt.CHECKPOINT_NAME
    folder = out.parent
    if folder.is_dir():
        found = ownership.identify(folder)
        if found.kind in ownership.FOLDER_KINDS:
            raise EulerError(f"--out {out}: {folder} holds {found.words}; import elsewhere")
    elif out.name == ckpt.CHECKPOINT_NAME:
        try:
            folder.mkdir(parents=True)
        except OSError as e:
            raise EulerError(f"--out {folder}: cannot make the folder ({e.strerror})") from None
    ownership.claim_file(out, ownership.CHECKPOINT, overwrite, reads)
    return out


def import_hf(
    src: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    n_mtp: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    context: int | None = None,
) -> tuple[Path, ModelConfig, list[str]]:
    """Write a NanoEuler checkpoint for the Hugging Face Llama folder src.

    tokenizer: one of our tokenizer files, used instead of src/tokenizer.json. n_mtp: the
    number of heads K when src has no side file (default 1). context: the context to run
    at (default max_position_embeddings). Returns (checkpoint path, config, notes).
    """
    src, notes = Path(src), []
    if not src.is_dir():
        raise EulerError(f"not a folder: {src}")
    if Path(out).resolve().is_relative_to(src.resolve()):
        raise EulerError(f"--out {out} is inside the folder being imported; choose another")
    reads = [("SRC", src), ("--tokenizer", Path(tokenizer) if tokenizer else None)]
    out = claim_checkpoint(Path(out), overwrite, reads)
    c = Fields(read_json(src / "config.json", "config.json"), str(src / "config.json"))
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
    if context is not None:
        cfg = dataclasses.replace(cfg, context=context)
    # tied: head 0 is the embedding (a tied save drops lm_head; one that keeps it must equal)
    tied = c.get("tie_word_embeddings", False)
    if tied not in (True, False):
        c.fail("tie_word_embeddings", "true or false", tied)
    if tied:
        if heads[0] is not None and not np.array_equal(heads[0], tensors.get(hf_name("tok_emb"))):
            raise EulerError(f"{c.where}: tie_word_embeddings is true, but {HEAD} differs "
                             "from the embedding")  # fmt: skip
        if hf_name("tok_emb") not in tensors:
            raise EulerError(f"{src}: tensor {hf_name('tok_emb')} is missing")
        cfg = dataclasses.replace(cfg, tie_embeddings=True)
        heads[0] = tensors[hf_name("tok_emb")]
    if heads[0] is None:
        raise EulerError(f"{src}: tensor {HEAD} is missing")
    if tok.vocab_size > cfg.vocab_size:
        raise EulerError(f"tokenizer has {tok.vocab_size} ids, the model only {cfg.vocab_size}")
    layout = ParamLayout(cfg)
    # every shape checked before the model's buffer is allocated: the config's sizes are
    # a stranger's claim, the tensors are what the files hold
    for name, shape, _ in layout.table:
        t = tensors.get(hf_name(name)) if name != "mtp_heads" else heads[0]
        want = shape if name != "mtp_heads" else shape[1:]
        if t is None or t.shape != want:
            got = "missing" if t is None else f"shape {t.shape}"
            what = hf_name(name) if name != "mtp_heads" else HEAD
            raise EulerError(f"{src}: tensor {what} is {got}; config needs {want}")
    ours = {hf_name(n) for n, _, _ in layout.table if n != "mtp_heads"}
    unexpected = sorted(set(tensors) - ours)
    if unexpected:
        raise EulerError(f"{src}: unexpected tensor {unexpected[0]}: our block has no such weight")
    for k, h in enumerate(heads[1:], start=1):
        if h.shape != (cfg.vocab_size, cfg.d_model):
            raise EulerError(f"{side}: head {k} has shape {h.shape}, config needs (V, D)")
    params = init_params(layout, seed)  # only heads 1..K-1 keep these values, if unsaved
    views = layout.views(params)
    for name, _, _ in layout.table:
        if name != "mtp_heads":
            views[name][...] = tensors[hf_name(name)]
    for k, h in enumerate(heads):
        if not (k == 0 and cfg.tie_embeddings):  # a tied head 0 is tok_emb, already set
            head_weights(cfg, views)[k][...] = h
    if cfg.n_mtp > len(heads):
        notes.append(
            f"no {SIDE_FILE}: MTP heads 1..{cfg.n_mtp - 1} are freshly initialised "
            f"(seed {seed}); train them before speculative decoding"
        )
    if getattr(tok, "chat_spec", 0) is None:
        notes.append("the folder's chat template is not ChatML: euler chat and serve refuse it")
    ckpt.save(out, cfg, params, None, {}, {"imported_from": str(src)}, tok.to_json())
    return out, cfg, notes


def _tokenizer(src: Path, path: str | Path | None) -> Tokenizer | HFByteLevelBPE:
    """The tokenizer file `path` (ours or a saved foreign one), else src/tokenizer.json: our
    Tokenizer if it is one of ours, else a foreign byte-level BPE with src's chat template."""
    from euler.tokenizer import HFByteLevelBPE, load_any

    if path is not None:
        return load_any(path)
    hf = src / "tokenizer.json"
    if not hf.is_file():
        raise EulerError(f"{hf}: not found; give --tokenizer")
    doc = read_json(hf, "tokenizer")
    try:
        return tokenizer_from_hf(doc, hf)
    except EulerError:
        pass  # not ours: someone else's byte-level BPE, or a one-line refusal naming why
    return HFByteLevelBPE(doc, _chat_template(src), str(hf))


def _chat_template(src: Path) -> dict | None:
    """The ChatML spec of src's chat template (tokenizer_config.json's chat_template, or
    chat_template.jinja), or None."""
    from euler.data.chat_template import chatml_spec

    config = src / "tokenizer_config.json"
    jinja = src / "chat_template.jinja"
    if jinja.is_file():
        return chatml_spec(jinja.read_text(encoding="utf-8"), str(jinja))
    if config.is_file():
        template = Fields(read_json(config, "tokenizer config"), str(config)).get(
            "chat_template", None
        )
        return chatml_spec(template if isinstance(template, str) else None, str(config))
    return None
