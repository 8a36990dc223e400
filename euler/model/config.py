"""Model configuration: one versioned dataclass and the named presets.

Shape letters used across the code base (defined once, here):
B batch, T time, D model width, H query heads, G kv heads, E head size,
F MLP hidden size, V vocabulary, K multi-token-prediction heads, L layers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from euler.errors import EulerError

CONFIG_VERSION = 1


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer (RMSNorm, RoPE, GQA, SwiGLU, K MTP heads).

    tie_embeddings: head 0 is the embedding matrix itself (GPT-2, Llama 3.2, SmolLM2); the
    table then holds K - 1 head matrices. A config saved before the field existed reads as
    untied.
    """

    vocab_size: int = 512  # V
    d_model: int = 128  # D
    n_head: int = 4  # H
    n_kv_head: int = 2  # G
    n_layer: int = 4  # L
    context: int = 128  # longest T the model accepts
    n_mtp: int = 4  # K: head k predicts token t+1+k
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    ffn_hidden: int = 0  # F; 0 means the SwiGLU default floor(8 D / 3)
    init_std: float = 0.02
    # head 0 reads the embedding matrix (V, D) and adds its weight gradient into it
    tie_embeddings: bool = False
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 8 * self.d_model // 3)
        self.validate()

    @property
    def head_size(self) -> int:
        """E: width of one attention head."""
        return self.d_model // self.n_head

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_size

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_size

    @property
    def qkv_dim(self) -> int:
        """Width of the fused q|k|v projection output."""
        return self.q_dim + 2 * self.kv_dim

    def validate(self) -> None:
        """Raise EulerError naming the first field that makes the architecture impossible."""
        positive = ("vocab_size", "d_model", "n_head", "n_kv_head", "n_layer", "context", "n_mtp")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EulerError(f"config field {name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise EulerError(
                f"config field d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            )
        if self.n_head % self.n_kv_head:
            raise EulerError(
                f"config field n_head ({self.n_head}) must be divisible by n_kv_head "
                f"({self.n_kv_head})"
            )
        if self.head_size % 2:
            raise EulerError(
                f"config field d_model/n_head gives an odd head size ({self.head_size}); "
                "RoPE rotates pairs, so it must be even"
            )
        if self.ffn_hidden < 1:
            raise EulerError(f"config field ffn_hidden must be positive, got {self.ffn_hidden}")
        if not self.rope_base > 1.0:
            raise EulerError(f"config field rope_base must be > 1, got {self.rope_base}")
        if not self.norm_eps > 0.0:
            raise EulerError(f"config field norm_eps must be > 0, got {self.norm_eps}")
        if not isinstance(self.tie_embeddings, bool):
            raise EulerError(
                f"config field tie_embeddings must be true or false, got {self.tie_embeddings!r}"
            )
        if self.version != CONFIG_VERSION:
            raise EulerError(
                f"config field version is {self.version}; this build reads version {CONFIG_VERSION}"
            )

    def check_sequence(self, t: int) -> None:
        """Refuse a sequence longer than the context before any kernel runs."""
        if t > self.context:
            raise EulerError(f"sequence length {t} exceeds config field context ({self.context})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: object, source: str = "config") -> ModelConfig:
        """Build from a JSON object (a checkpoint's, run.json's): every field present and of
        its type, none unknown; EulerError naming `source` and the field otherwise."""
        from euler.schema import Fields, dataclass_values

        if isinstance(d, dict) and "tie_embeddings" not in d:
            d = {**d, "tie_embeddings": False}  # saved before the field existed: untied
        values = dataclass_values(cls, Fields(d, source))
        try:
            return cls(**values)
        except EulerError as e:
            raise EulerError(f"{source}: {e}") from None

    def n_params(self) -> int:
        """Exact parameter count (head 0 counted once when tied to the embedding)."""
        from euler.model.params import param_table

        return sum(int(_prod(shape)) for _, shape, _ in param_table(self))


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


PRESETS: dict[str, ModelConfig] = {
    # for tests: every code path, seconds to run; T=24 is not a multiple of the attention tile
    "tiny": ModelConfig(
        vocab_size=320, d_model=32, n_head=4, n_kv_head=2, n_layer=2, context=24, n_mtp=4
    ),
    "small": ModelConfig(
        vocab_size=512, d_model=128, n_head=4, n_kv_head=2, n_layer=4, context=128, n_mtp=4
    ),
    "gpu": ModelConfig(
        vocab_size=4096, d_model=768, n_head=12, n_kv_head=4, n_layer=16, context=512, n_mtp=4
    ),
}


def get_preset(name: str) -> ModelConfig:
    """Look a preset up by name; a one-line error lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise EulerError(
            f"--preset: unknown preset {name!r} (known: {', '.join(PRESETS)})"
        ) from None
