"""TrainConfig, every setting of a training run, and the learning-rate schedule.

Each field that a user sets carries its command-line flag in its metadata (a Flag: the
flag's name, its help, the `euler sft` default where that differs): `euler train` and
`euler sft` build their options from these fields, so a field added here is a flag of both
commands. A field without a flag (set by the command, or fixed) says so with `no_flag`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from euler.errors import EulerError
from euler.model.config import ModelConfig, get_preset
from euler.precision import precision_help, resolve_precision
from euler.schema import Fields, check_number, dataclass_values, read_json, read_toml

TRAIN_CONFIG_VERSION = 2  # 2: `precision` replaced version 1's `tf32`
KINDS = ("pretrain", "sft")  # `euler train` runs kind pretrain, `euler sft` kind sft
_SAME = object()  # Flag.sft_default: the same default as pretraining


@dataclass(frozen=True)
class Flag:
    """How a TrainConfig field appears on `euler train` and `euler sft`.

    decls: the flag and its short form ("--out", "-o"); empty: --field-name (for a bool
    also --no-field-name). path: shown and parsed as a path, stored as a string.
    old: the flag's old spelling, still accepted (hidden, with a note) for one release.
    """

    help: str
    decls: tuple[str, ...] = ()
    sft_default: Any = _SAME
    sft_help: str = ""  # `euler sft`'s help where it differs
    kinds: tuple[str, ...] = KINDS  # the commands that have the flag, by the kind they run
    path: bool = False
    old: str = ""


def setting(default: Any, help: str, *decls: str, **flag: Any) -> Any:
    """A TrainConfig field that a user sets by flag: its default and its Flag."""
    return field(default=default, metadata={"flag": Flag(help, decls, **flag)})


def no_flag(default: Any) -> Any:
    """A TrainConfig field that no flag sets: the command sets it, or it is fixed."""
    return field(default=default, metadata={"flag": None})


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs besides the model config; saved in run.json and checkpoints."""

    # sft: the architecture of the --checkpoint it starts from, whatever the preset
    preset: str = setting("small", "Model preset: tiny, small or gpu.", kinds=("pretrain",))
    init_from: str | None = setting(  # sft: the checkpoint whose weights the run starts from
        None, "Pretrained checkpoint (or run folder) to start from.", "--checkpoint",
        kinds=("sft",), path=True, old="--from",
    )  # fmt: skip
    data: str | None = setting(  # pretrain: None = the embedded corpus
        None, "Folder from `euler data prepare` (default: the embedded corpus).",
        sft_help="Folder from `euler data prepare-sft`.", path=True,
    )  # fmt: skip
    out_dir: str = setting(
        "runs/pretrain", "Run folder (checkpoint, metrics).", "--out", "-o",
        sft_default="runs/sft", path=True,
    )  # fmt: skip
    # the architecture: the preset's, with each size given here (non-zero) in its place
    n_layer: int = setting(0, "L: layers (0: the preset's).", kinds=("pretrain",))
    d_model: int = setting(0, "D: model width (0: the preset's).", kinds=("pretrain",))
    n_head: int = setting(0, "H: query heads (0: the preset's).", kinds=("pretrain",))
    n_kv_head: int = setting(0, "G: key/value heads (0: the preset's).", kinds=("pretrain",))
    context: int = setting(0, "The model's context: the longest sequence it takes (0: the "
                           "preset's).", kinds=("pretrain",))  # fmt: skip
    tie_embeddings: bool = setting(
        False, "Head 0 reads the embedding matrix (GPT-2's tied embeddings).", kinds=("pretrain",)
    )
    kind: str = no_flag("pretrain")  # "pretrain" (token shards) or "sft": set by the command
    device: str = setting("cpu", "cpu, or cuda (needs the gpu extra and a GPU).")
    # None: euler.precision.ACCEPTED's default (run.json holds the resolved one)
    precision: str | None = setting(None, precision_help("train"))
    exact_attention: bool = setting(
        False, "cuda with --precision tf32: attention in exact fp32 instead of on tensor cores."
    )
    cuda_graph: bool = setting(
        True, "cuda: capture each step's kernels once as CUDA graphs and replay them; "
        "--no-cuda-graph launches them one by one.",
    )  # fmt: skip
    batch_size: int = setting(8, "B: sequences per micro-batch.")
    # sft has no --seq-len: `euler data prepare-sft` fits its records to the model's context,
    # and a shorter T would cut responses off
    seq_len: int = setting(
        0, "T: tokens per sequence (0: the model's context).", kinds=("pretrain",)
    )
    grad_accum: int = setting(1, "Micro-batches per optimizer step.")
    steps: int = setting(1000, "Optimizer steps (unless --tokens is given).", sft_default=300)
    tokens: int = setting(0, "Token budget; sets the steps (0: use --steps).")
    lr: float = setting(3e-3, "Peak learning rate (after warmup).", sft_default=1e-3)
    min_lr: float = setting(3e-4, "Learning rate at the end of the cosine decay.", sft_default=1e-4)
    # linear warmup from lr / warmup_steps to lr
    warmup_steps: int = setting(
        50, "Learning-rate warmup: linear, in optimizer steps.", sft_default=20, old="--warmup"
    )
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay (matrices only).")
    grad_clip: float = setting(1.0, "Clip the global gradient norm (0: off).")
    beta1: float = no_flag(0.9)  # AdamW's moment decays: fixed
    beta2: float = no_flag(0.95)
    eval_every: int = setting(100, "Steps between validation losses and samples.", sft_default=50)
    eval_batches: int = setting(8, "Validation micro-batches per evaluation.")
    sample_tokens: int = setting(40, "Tokens of the sample shown at evaluations.")
    # a checkpoint is also written at the end and on Ctrl-C
    ckpt_every: int = setting(100, "Steps between checkpoints.", sft_default=50)
    keep_every: int = setting(
        0, "Also keep every N-th step's checkpoint, as checkpoint-stepNNNNNNN.safetensors "
        "(0: only the latest).",
    )  # fmt: skip
    keep_best: bool = setting(
        False, "Also keep the checkpoint of the lowest validation loss, as "
        "checkpoint-best.safetensors.",
    )  # fmt: skip
    log_every: int = setting(10, "Steps between log lines (non-terminal output).")
    tensorboard: str | None = setting(
        None, "Also write TensorBoard event files into this folder (pip install -e "
        "'.[tensorboard]').", path=True,
    )  # fmt: skip
    seed: int = setting(0, "Seed of the weights, batches and samples.")
    version: int = no_flag(TRAIN_CONFIG_VERSION)

    def __post_init__(self) -> None:
        """Refuse settings no run can use, naming the flag: flags and run.json both land here."""
        if self.kind not in KINDS:
            raise EulerError(f"kind must be 'pretrain' or 'sft', got {self.kind!r}")
        if self.device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {self.device!r}")
        # frozen: the resolved default is set once, here
        command = "sft" if self.kind == "sft" else "train"
        object.__setattr__(
            self, "precision", resolve_precision(self.device, self.precision, command)
        )
        if self.exact_attention and self.precision == "bf16":
            raise EulerError(
                "--exact-attention: bf16 attention runs on tensor cores; it applies to "
                "--precision tf32"
            )
        for name, (lo, hi) in INT_RANGES.items():
            check_int(getattr(self, name), flag_name(name), lo, hi)
        if self.kind == "pretrain":
            self.model_config()  # sft takes its architecture from --checkpoint instead
        if self.kind == "sft" and not self.data:
            raise EulerError("sft needs --data: a folder prepared by `euler data prepare-sft`")
        if self.steps == 0 and self.tokens == 0:
            raise EulerError("give --steps or --tokens")
        check_number(self.lr, "--lr", lo=0.0, lo_open=True)
        check_number(self.min_lr, "--min-lr", lo=0.0, hi=self.lr)
        check_number(self.weight_decay, "--weight-decay", lo=0.0)
        check_number(self.grad_clip, "--grad-clip", lo=0.0)
        for name in ("beta1", "beta2"):  # no flag: only a run.json can set them
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise EulerError(f"{name} must be in [0, 1), got {value}")
        if self.version != TRAIN_CONFIG_VERSION:
            raise EulerError(f"train config version {self.version}, need {TRAIN_CONFIG_VERSION}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def model_config(self) -> ModelConfig:
        """The architecture a pretraining run builds: the preset's, with each size setting
        given (non-zero) in its place; an impossible one is refused naming its flag."""
        sizes: dict[str, Any] = {n: getattr(self, n) for n in MODEL_SIZES if getattr(self, n)}
        if self.tie_embeddings:
            sizes["tie_embeddings"] = True
        if "d_model" in sizes:
            sizes["ffn_hidden"] = 0  # the SwiGLU default of the new width
        try:
            return dataclasses.replace(get_preset(self.preset), **sizes)
        except EulerError as e:  # "config field d_model ..." -> "--d-model ..."
            message = str(e)
            for name in MODEL_SIZES:
                message = message.replace(f"config field {name}", flag_name(name))
            raise EulerError(f"{message} (--preset {self.preset} with the sizes given)") from None

    @classmethod
    def from_fields(cls, f: Fields) -> TrainConfig:
        """Read from a JSON object (run.json's `train`): every field present and of its type,
        none unknown, then the flags' checks; EulerError naming the file and the field.
        A version 1 object (`tf32`, no `precision`) reads as the precision it ran in."""
        if f.get("version", None) == 1 and isinstance(f.get("tf32", None), bool):
            old = dict(f.data)
            tf32 = old.pop("tf32")
            on_gpu = old.get("device") == "cuda"
            old["precision"] = "tf32" if tf32 and on_gpu else "fp32"
            old["version"] = TRAIN_CONFIG_VERSION
            f = Fields(old, f.where, f.prefix)
        missing = {n: v for n, v in ADDED_FIELDS.items() if not f.has(n)}
        if missing:  # a run.json from before these fields: their defaults
            f = Fields({**f.data, **missing}, f.where, f.prefix)
        values = dataclass_values(cls, f)
        try:
            return cls(**values)
        except EulerError as e:
            raise EulerError(f"{f.where}: {f.prefix or 'train config'}: {e}") from None

    @classmethod
    def from_dict(cls, d: object, source: str = "train config") -> TrainConfig:
        """from_fields of a JSON object that came from `source`."""
        return cls.from_fields(Fields(d, source))

    def total_steps(self, T: int) -> int:
        """Optimizer steps of the run: `steps`, or enough steps to see `tokens` tokens."""
        if self.tokens:
            return math.ceil(self.tokens / (self.batch_size * T * self.grad_accum))
        return self.steps


# the integer settings' ranges; the upper bounds only keep absurd values from reaching NumPy
MODEL_SIZES = ("n_layer", "d_model", "n_head", "n_kv_head", "context")
# fields added to version 2 after it first shipped, with the value an older run.json means
ADDED_FIELDS = {**dict.fromkeys(MODEL_SIZES, 0), "tie_embeddings": False, "keep_every": 0,
                "keep_best": False, "tensorboard": None}  # fmt: skip
INT_RANGES = {
    "n_layer": (0, 1024),
    "d_model": (0, 1 << 16),
    "n_head": (0, 1024),
    "n_kv_head": (0, 1024),
    "context": (0, 1 << 20),
    "batch_size": (1, 1 << 16),
    "seq_len": (0, 1 << 20),
    "grad_accum": (1, 1 << 16),
    "steps": (0, 10**12),
    "tokens": (0, 10**15),
    "warmup_steps": (0, 10**12),
    "eval_every": (1, 10**12),
    "eval_batches": (1, 1 << 16),
    "sample_tokens": (0, 1 << 16),
    "ckpt_every": (1, 10**12),
    "keep_every": (0, 10**12),
    "log_every": (1, 10**12),
    "seed": (0, 2**63 - 1),
}
# what `--resume` may change; every other setting is the run's own, from its run.json
# (checkpoints hold fp32 master weights: a run resumes in another precision, or device)
RESUME_FLAGS = ("steps", "ckpt_every", "log_every", "device", "precision", "exact_attention",
                "cuda_graph")  # fmt: skip


def read_config_file(path: Path, kind: str) -> dict[str, Any]:
    """The settings a `--config` file gives the command running `kind`, by field name.

    The file is TOML or JSON (by its suffix): an object of TrainConfig fields named as in
    run.json (`n_layer = 6`, `lr = 1e-3`), any subset, or a whole run.json (its `train`
    object: a run's settings, to start another like it). Each value is checked for its
    type here and for its range where the TrainConfig is built; a field the command has no
    flag for (`kind`, `version`, sft's `preset`) may appear only with the value the command
    would use, so a run.json of either command reads, and nothing a flag cannot set slips in.
    """
    path = Path(path)
    if path.suffix == ".toml":
        data: Any = read_toml(path, "config file")
    elif path.suffix == ".json":
        data = read_json(path, "config file")
    else:
        raise EulerError(f"--config {path}: expected a .toml or .json file")
    f = Fields(data, str(path))
    if f.has("train") and f.has("run_id"):  # a run folder's run.json
        f = f.obj("train")
    values = dataclass_values(TrainConfig, f, required=False)
    for entry in dataclasses.fields(TrainConfig):
        flag = flag_of(entry)
        if entry.name not in values or (flag is not None and kind in flag.kinds):
            continue
        fixed = {"kind": kind}.get(entry.name, flag_default(entry, kind))
        if values.pop(entry.name) != fixed:
            command = "sft" if kind == "sft" else "train"
            f.fail(entry.name, f"{fixed!r} (euler {command} does not set it)",
                   f.get(entry.name))  # fmt: skip
    return values


def check_int(value: object, flag: str, lo: int, hi: int) -> int:
    """An integer setting in [lo, hi], else EulerError naming the flag."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EulerError(f"{flag} must be an integer in [{lo:,}, {hi:,}], got {value!r}")
    return value


def flag_of(f: dataclasses.Field) -> Flag | None:
    """The Flag of a TrainConfig field (None: no flag); a field that does not say is an error."""
    if "flag" not in f.metadata:
        raise EulerError(
            f"TrainConfig.{f.name} declares no flag: give it setting(...) or no_flag(...)"
        )
    return f.metadata["flag"]


def flag_name(name: str) -> str:
    """The command-line flag of TrainConfig field `name`: "--checkpoint" for init_from."""
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == name)
    flag = flag_of(f)
    return flag.decls[0] if flag and flag.decls else "--" + name.replace("_", "-")


def flag_default(f: dataclasses.Field, kind: str) -> Any:
    """The default of field f on the command that runs `kind` (pretrain: the field's own)."""
    flag = flag_of(f)
    if kind == "sft" and flag is not None and flag.sft_default is not _SAME:
        return flag.sft_default
    return f.default


def lr_at(step: int, tc: TrainConfig, total: int) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, total - tc.warmup_steps)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))
