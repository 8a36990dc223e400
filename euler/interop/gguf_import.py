"""Import a llama.cpp GGUF file (architecture `llama`) as a NanoEuler checkpoint.

The `gguf` package (llama.cpp's own reader) reads the file and dequantizes every tensor to
float32: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are tested here (tests/test_import_
pretrained.py writes them with gguf's own quantizer); the k-quants (Q2_K..Q6_K) go through the
same gguf call. The dequantized values are the model; nothing is re-rounded afterwards.

Metadata -> ModelConfig:

    llama.block_count                        n_layer
    llama.embedding_length                   d_model
    llama.feed_forward_length                ffn_hidden
    llama.attention.head_count(_kv)          n_head, n_kv_head
    llama.context_length                     context (or --context N)
    llama.rope.freq_base                     rope_base (10000 if absent)
    llama.attention.layer_norm_rms_epsilon   norm_eps
    llama.vocab_size / tokenizer tokens      vocab_size
    no output.weight                         tie_embeddings (head 0 = token_embd)

Refused, in one line naming the field or tensor: another architecture, rope scaling or a
partial rotary width (llama.rope.dimension_count != head size), experts, biases,
rope_freqs (Llama 3.1's scaled RoPE), a tokenizer other than byte-level BPE (`gpt2`).

Tensors: llama.cpp's converter permutes the rows of attn_q and attn_k so that its rotation of
adjacent pairs equals Hugging Face's rotation of halves; we rotate halves, so the import
undoes that permutation (as transformers' GGUF loader does).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from euler.errors import EulerError
from euler.interop.hf_import import claim_checkpoint
from euler.model.config import ModelConfig
from euler.model.params import ParamLayout, head_weights, init_params
from euler.training import checkpoint as ckpt

ARCH = "llama"
# our param_table name -> GGUF tensor name ({l}: the layer); mtp_heads head 0 is "output"
GGUF_NAMES = {
    "tok_emb": "token_embd.weight",
    "attn.wq": "blk.{l}.attn_q.weight",
    "attn.wk": "blk.{l}.attn_k.weight",
    "attn.wv": "blk.{l}.attn_v.weight",
    "attn.wo": "blk.{l}.attn_output.weight",
    "mlp.w_gate": "blk.{l}.ffn_gate.weight",
    "mlp.w_up": "blk.{l}.ffn_up.weight",
    "mlp.w_down": "blk.{l}.ffn_down.weight",
    "attn_norm": "blk.{l}.attn_norm.weight",
    "mlp_norm": "blk.{l}.ffn_norm.weight",
    "final_norm": "output_norm.weight",
}
OUTPUT = "output.weight"


def gguf_name(name: str) -> str:
    """The GGUF tensor name of one of our param_table names (not mtp_heads)."""
    if name.startswith("layers."):
        _, layer, rest = name.split(".", 2)
        return GGUF_NAMES[rest].format(l=layer)
    return GGUF_NAMES[name]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows (n_head * E, D) of a GGUF attn_q / attn_k back to Hugging Face's order: the
    inverse of convert_hf_to_gguf's permute (pairs (2i, 2i+1) of each head -> halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFFile:
    """The metadata and tensors of one GGUF file, read by the `gguf` package."""

    def __init__(self, path: Path):
        try:
            import gguf
        except ImportError:
            raise EulerError("--format gguf needs the gguf package: pip install gguf") from None
        self.path = path
        if not path.is_file():
            raise EulerError(f"{path}: GGUF file not found")
        try:
            self.reader = gguf.GGUFReader(str(path))
        except Exception as e:  # the reader raises ValueError, struct.error, ...
            raise EulerError(f"{path}: not a readable GGUF file ({str(e)[:120]})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._gguf = gguf

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def get(self, key: str, default=None):
        """A metadata value (int, float, str or list), or default when absent."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception:
            raise EulerError(f"{self.path}: metadata {key} cannot be read") from None

    def int(self, key: str, default=None) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            what = "missing" if v is None else repr(v)
            raise EulerError(f"{self.path}: {key} is {what}; expected a positive integer")
        return v

    def float(self, key: str, default=None) -> float:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
            what = "missing" if v is None else repr(v)
            raise EulerError(f"{self.path}: {key} is {what}; expected a number")
        return float(v)

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` dequantized to float32, in NumPy order (rows = GGUF's last dim)."""
        t = self.tensors.get(name)
        if t is None:
            raise EulerError(f"{self.path}: tensor {name} is missing")
        try:
            a = self._gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise EulerError(
                f"{self.path}: tensor {name} is {t.tensor_type.name}, which gguf cannot dequantize"
            ) from None
        a = np.ascontiguousarray(a, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if not np.isfinite(a).all():
            raise EulerError(f"{self.path}: tensor {name} holds non-finite values")
        return a

    def quant_types(self) -> dict[str, int]:
        """Tensor type name -> how many tensors have it."""
        out: dict[str, int] = {}
        for t in self.reader.tensors:
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out


def config_from_gguf(g: GGUFFile, n_mtp: int = 1, context: int | None = None) -> ModelConfig:
    """ModelConfig for a llama GGUF's metadata; EulerError naming the first field our
    config cannot express."""
    arch = g.get("general.architecture")
    if arch != ARCH:
        raise EulerError(f"{g.path}: general.architecture is {arch!r}; NanoEuler reads 'llama'")
    p = f"{ARCH}."
    refused = {
        "rope.scaling.type": (None, "none"),  # linear / yarn scaling
        "rope.scaling.factor": (None, 0, 0.0, 1.0),
        "expert_count": (None, 0),  # mixture of experts
    }
    for key, plain in refused.items():
        if g.get(p + key) not in plain:
            raise EulerError(f"{g.path}: {p}{key} is {g.get(p + key)!r}; NanoEuler has plain "
                             "RoPE and dense MLPs")  # fmt: skip
    d, heads = g.int(p + "embedding_length"), g.int(p + "attention.head_count")
    kv = g.int(p + "attention.head_count_kv", heads)
    if d % heads:
        raise EulerError(f"{g.path}: {p}embedding_length {d} is not a multiple of head_count")
    E = d // heads
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if g.has(p + key) and g.get(p + key) != E:
            raise EulerError(f"{g.path}: {p}{key} is {g.get(p + key)}; NanoEuler needs the head "
                             f"size {E}")  # fmt: skip
    tokens = g.get("tokenizer.ggml.tokens")
    vocab = g.int(p + "vocab_size", len(tokens) if tokens else None)
    trained = g.int(p + "context_length")
    if context is not None and context < 1:
        raise EulerError(f"--context must be at least 1, got {context}")
    tied = OUTPUT not in g.tensors
    try:
        return ModelConfig(
            vocab_size=vocab,
            d_model=d,
            n_head=heads,
            n_kv_head=kv,
            n_layer=g.int(p + "block_count"),
            context=context or trained,
            n_mtp=n_mtp,
            rope_base=g.float(p + "rope.freq_base", 10000.0),
            norm_eps=g.float(p + "attention.layer_norm_rms_epsilon", 1e-5),
            ffn_hidden=g.int(p + "feed_forward_length"),
            tie_embeddings=tied,
        )
    except EulerError as e:
        raise EulerError(f"{g.path}: {e}") from None


def tokenizer_from_gguf(g: GGUFFile):
    """The file's byte-level BPE (tokenizer.ggml.*) with its chat template (ChatML, or
    none when the template is another)."""
    from euler.data.chat_template import chatml_spec
    from euler.tokenizer import HFByteLevelBPE

    model = g.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise EulerError(f"{g.path}: tokenizer.ggml.model is {model!r}; NanoEuler reads 'gpt2' "
                         "(byte-level BPE)")  # fmt: skip
    tokens = g.get("tokenizer.ggml.tokens")
    types = g.get("tokenizer.ggml.token_type") or [1] * len(tokens or [])
    merges = g.get("tokenizer.ggml.merges")
    if not tokens or not merges:
        raise EulerError(f"{g.path}: tokenizer.ggml.tokens or merges is missing")
    chat = chatml_spec(g.get("tokenizer.chat_template"), "tokenizer.chat_template")
    pre = g.get("tokenizer.ggml.pre", "default")
    return HFByteLevelBPE.from_gguf(tokens, types, merges, pre, str(g.path), chat)


def import_gguf(
    src: str | Path,
    out: str | Path,
    n_mtp: int | None = None,
    context: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> tuple[Path, ModelConfig, list[str]]:
    """Write a NanoEuler checkpoint for the llama GGUF file src.

    n_mtp: K heads (default 1: the file's output head, or the tied embedding); heads
    1..K-1 are freshly initialised. context: the context to run at (default the file's
    llama.context_length). Returns (checkpoint path, config, notes for the user).
    """
    src = Path(src)
    g = GGUFFile(src)
    cfg = config_from_gguf(g, n_mtp or 1, context)
    tok = tokenizer_from_gguf(g)
    if tok.vocab_size != cfg.vocab_size:
        raise EulerError(f"{src}: the tokenizer has {tok.vocab_size} ids, llama.vocab_size "
                         f"{cfg.vocab_size}")  # fmt: skip
    layout = ParamLayout(cfg)
    names = {gguf_name(n) for n, _, _ in layout.table if n != "mtp_heads"}
    names |= set() if cfg.tie_embeddings else {OUTPUT}
    extra = sorted(set(g.tensors) - names)
    if extra:
        raise EulerError(f"{src}: unexpected tensor {extra[0]}: our block has no such weight")
    out = claim_checkpoint(Path(out), overwrite, [("SRC", src)])
    params = init_params(layout, seed)  # only heads 1..K-1 keep these values
    views = layout.views(params)
    for name, shape, _ in layout.table:
        if name == "mtp_heads":
            continue
        a = g.tensor(gguf_name(name))
        if a.shape != shape:
            raise EulerError(f"{src}: tensor {gguf_name(name)} has shape {a.shape}; the "
                             f"metadata needs {shape}")  # fmt: skip
        if name.endswith("attn.wq"):
            a = unpermute(a, cfg.n_head)
        elif name.endswith("attn.wk"):
            a = unpermute(a, cfg.n_kv_head)
        views[name][...] = a
    if not cfg.tie_embeddings:
        head = g.tensor(OUTPUT)
        if head.shape != (cfg.vocab_size, cfg.d_model):
            raise EulerError(f"{src}: tensor {OUTPUT} has shape {head.shape}")
        head_weights(cfg, views)[0][...] = head
    notes = [f"tensors: {', '.join(f'{n} {k}' for k, n in sorted(g.quant_types().items()))}; "
             "dequantized to float32 by gguf"]  # fmt: skip
    if cfg.n_mtp > 1:
        notes.append(f"MTP heads 1..{cfg.n_mtp - 1} are freshly initialised (seed {seed})")
    if tok.chat_spec is None:
        notes.append("the file's chat template is not ChatML: euler chat and serve refuse it")
    if g.get("tokenizer.ggml.add_bos_token"):
        notes.append("tokenizer.ggml.add_bos_token is true; NanoEuler adds no BOS token")
    origin = {"imported_from": os.path.abspath(src), "format": "gguf"}
    ckpt.save(out, cfg, params, None, {}, origin, tok.to_json())
    return out, cfg, notes
