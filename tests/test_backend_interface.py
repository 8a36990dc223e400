"""The backend interface (euler/backend.py): both backends implement it, shapes are checked,
and the import rules hold (nothing outside euler/cpu/ reaches a CPU kernel; euler/gpu/
imports nothing of euler/cpu/). Checked without a GPU: GpuBackend is inspected, never made.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from euler.backend import Backend
from euler.cpu.backend import CpuBackend
from euler.errors import EulerError
from euler.gpu.backend import GpuBackend

EULER = Path(__file__).resolve().parent.parent / "euler"
METHODS = sorted(
    n for n, v in vars(Backend).items() if inspect.isfunction(v) and not n.startswith("_")
)
CAPABILITIES = sorted(n for n in Backend.__annotations__)


def _signature(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def protocol_mismatches(cls) -> list[str]:
    """What of Backend cls lacks, or has with other parameter names, kinds or defaults."""
    bad = []
    for name in METHODS:
        impl = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(impl):
            bad.append(f"{name}: missing")
        elif _signature(impl) != _signature(vars(Backend)[name]):
            bad.append(
                f"{name}: {inspect.signature(impl)} != {inspect.signature(vars(Backend)[name])}"
            )
    for name in CAPABILITIES:
        attr = inspect.getattr_static(cls, name, None)
        if attr is None or inspect.isfunction(attr):
            bad.append(f"{name}: no capability attribute")
    return bad


def test_the_protocol_lists_the_kernels_and_capabilities():
    assert len(METHODS) == 32
    assert {"can_capture", "kv_cache", "name"} == set(CAPABILITIES)
    assert {"capture", "free_memory", "peak_memory", "release_unused"} <= set(METHODS)
    assert {"decode_linear", "decode_attention"} <= set(METHODS)


@pytest.mark.parametrize("cls", [CpuBackend, GpuBackend], ids=["cpu", "gpu"])
def test_each_backend_implements_the_protocol(cls):
    assert protocol_mismatches(cls) == []


def test_a_method_shared_by_both_backends_is_declared():
    """A kernel both backends grow must go into the Protocol, not stay a convention."""

    def public(cls):
        return {n for n, v in inspect.getmembers(cls, inspect.isfunction) if n[0] != "_"}

    assert public(CpuBackend) & public(GpuBackend) <= set(METHODS)


def test_the_check_sees_a_removed_renamed_or_changed_method():
    class Missing(CpuBackend):
        decode_linear = None

    class Renamed(CpuBackend):
        def wait_deferred(self, n: int = 0) -> None: ...

    class Default(CpuBackend):
        def rope_forward(self, qkv, cos, sin, H, G, E, pos0=1) -> None: ...

    class NoFlag:
        pass

    assert protocol_mismatches(Missing) == ["decode_linear: missing"]
    assert [m.split(":")[0] for m in protocol_mismatches(Renamed)] == ["wait_deferred"]
    assert [m.split(":")[0] for m in protocol_mismatches(Default)] == ["rope_forward"]
    assert "kv_cache: no capability attribute" in protocol_mismatches(NoFlag)


def test_the_cpu_answers_its_capabilities_honestly():
    be = CpuBackend()
    assert isinstance(be, Backend)
    assert be.name == "cpu" and be.can_capture is False and be.kv_cache is True
    assert be.free_memory() is None and be.peak_memory() is None
    be.release_unused()
    with pytest.raises(EulerError, match="can_capture is False"):
        be.capture(lambda: None)


def test_the_gpu_declares_its_kv_cache_and_decodes_float32_only():
    assert GpuBackend.name == "cuda" and GpuBackend.kv_cache is True
    assert isinstance(inspect.getattr_static(GpuBackend, "can_capture"), property)
    f32, f64 = np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float64)
    with pytest.raises(ValueError, match="decode_linear: x is float64; float32 expected"):
        GpuBackend.decode_linear(None, f32, f64, f32)
    cache, at = np.zeros((1, 2, 4, 8), np.float32), np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="slots and positions must be int32"):
        GpuBackend.decode_attention(None, f32, f32, cache, cache, at, at, 4, 2, 8)


# ------------------------------------------------------------------ shape checks

N, D, F, V, H, G, E, C = 3, 8, 6, 11, 4, 2, 4, 16
QKV = (H + 2 * G) * E


def _z(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def _cases():
    ones = np.ones(D, np.float32)
    tokens, targets = _z(N, dtype=np.int32), _z(N, dtype=np.int32)
    cos = _z(C, E // 2)
    hp = type("HP", (), {"grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                         "weight_decay": 0.0})  # fmt: skip
    hyper = np.array([1e-3, 0.1, 0.05])
    slots = np.array([0, 1, 1], np.int32)  # N rows: one of slot 0, two of slot 1
    at = lambda p: np.arange(p, p + N, dtype=np.int32)  # noqa: E731  (positions p.. of N rows)
    return {
        "embedding_forward": (
            "tokens",
            lambda be: be.embedding_forward(_z(N, D), _z(N + 1, dtype=np.int32), _z(V, D)),
        ),
        "embedding_backward": (
            "dx",
            lambda be: be.embedding_backward(_z(V, D), _z(N, D + 1), tokens, False),
        ),
        "rmsnorm_forward": (
            "rstd",
            lambda be: be.rmsnorm_forward(_z(N, D), _z(N + 1), _z(N, D), ones, 1e-5),
        ),  # fmt: skip
        "rmsnorm_backward": (
            "dres",
            lambda be: be.rmsnorm_backward(
                _z(N, D), _z(D), _z(N, D), _z(N, D - 1), _z(N, D), ones, _z(N), False
            ),
        ),  # fmt: skip
        "rope_forward": (
            "positions",
            lambda be: be.rope_forward(_z(1, N, QKV), cos, cos, H, G, E, C - 1),
        ),  # fmt: skip
        "rope_backward": ("qkv", lambda be: be.rope_backward(_z(1, N, QKV + 1), cos, cos, H, G, E)),
        "attention_forward": (
            "out",
            lambda be: be.attention_forward(
                _z(1, N, H * E + 1), _z(1, H, N), _z(1, N, QKV), H, G, E
            ),
        ),  # fmt: skip
        "attention_backward": (
            "dout",
            lambda be: be.attention_backward(
                _z(1, N, QKV),
                _z(1, N + 1, H * E),
                _z(1, N, QKV),
                _z(1, N, H * E),
                _z(1, H, N),
                H,
                G,
                E,
            ),
        ),  # fmt: skip
        "swiglu_forward": ("gu", lambda be: be.swiglu_forward(_z(N, F), _z(N, F))),
        "swiglu_backward": (
            "dgu",
            lambda be: be.swiglu_backward(_z(N, 2 * F + 1), _z(N, F), _z(N, 2 * F)),
        ),
        "residual_forward": ("b", lambda be: be.residual_forward(_z(N, D), _z(N, D), _z(N + 1, D))),
        "cross_entropy_forward": (
            "targets",
            lambda be: be.cross_entropy_forward(_z(N), _z(N, V), _z(N - 1, dtype=np.int32)),
        ),  # fmt: skip
        "cross_entropy_forward_backward": (
            "losses",
            lambda be: be.cross_entropy_forward_backward(
                _z(N + 1), _z(N, V), targets, np.ones(1), 0
            ),
        ),  # fmt: skip
        "adamw_step": ("v", lambda be: be.adamw_step(_z(10), _z(10), _z(10), _z(9), hp, hyper, 0)),
        "decode_linear": ("out", lambda be: be.decode_linear(_z(N, V + 1), _z(N, D), _z(V, D))),
        "decode_attention": (
            "k_cache",
            lambda be: be.decode_attention(
                _z(N, H * E), _z(N, QKV), _z(2, G, C, E + 1), _z(2, G, C, E), slots, at(0), H, G, E
            ),
        ),  # fmt: skip
        "decode_attention slots": (
            "slots",
            lambda be: be.decode_attention(
                _z(N, H * E), _z(N, QKV), _z(2, G, C, E), _z(2, G, C, E), slots[:2], at(0), H, G, E
            ),
        ),  # fmt: skip
        "decode_attention past the cache": (
            "positions",
            lambda be: be.decode_attention(
                _z(N, H * E), _z(N, QKV), _z(2, G, C, E), _z(2, G, C, E), slots, at(C - 1), H, G, E
            ),
        ),  # fmt: skip
        "decode_attention past the slots": (
            "slots",
            lambda be: be.decode_attention(
                _z(N, H * E), _z(N, QKV), _z(2, G, C, E), _z(2, G, C, E), slots + 1, at(0), H, G, E
            ),
        ),  # fmt: skip
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_a_wrong_shape_is_a_one_line_error_naming_the_tensor(case):
    tensor, call = _cases()[case]
    named = tensor if tensor == "positions" or " " in case else rf"\b{tensor} has shape"
    with pytest.raises(ValueError, match=named) as info:
        call(CpuBackend())
    assert "\n" not in str(info.value)


def test_every_kernel_method_has_a_shape_case():
    covered = {name.split(" ")[0] for name in _cases()}
    layer = {m for m in METHODS if m.endswith(("_forward", "_backward"))} | {"adamw_step"}
    assert layer | {"decode_linear", "decode_attention"} <= covered


def _asserts(path: Path) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Assert)]


CHECKED = [
    "cpu/backend.py", "gpu/backend.py", "gpu/embedding.py", "gpu/residual.py", "gpu/swiglu.py",
    "gpu/rope.py", "gpu/rmsnorm.py", "gpu/cross_entropy.py", "gpu/transpose.py",
    "gpu/attention.py", "gpu/adamw.py", "gpu/memory.py",
    "gpu/naive_attention.py", "gpu/async_copy.py",
]  # fmt: skip


@pytest.mark.parametrize("module", CHECKED)
def test_launchers_check_with_errors_not_asserts(module):
    """python -O strips asserts: a launcher's input check must raise."""
    assert _asserts(EULER / module) == []


# ------------------------------------------------------------------ import rules


def _imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) for every import in source, lazy ones included; name None for
    `import module`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, a.name) for a in node.names]
    return found


ALLOWED_OUTSIDE = {"euler.cpu", "euler.cpu.backend.CpuBackend"}  # the package: OpenMP setup


def import_violations(module: str, source: str) -> list[str]:
    """The imports of module (a dotted name under euler) that break the rules."""
    if module == "euler.cpu" or module.startswith("euler.cpu."):
        return []
    bad = []
    for mod, name in _imports(source):
        full = f"{mod}.{name}" if name else mod  # from X import Y reaches X.Y, module or name
        if not (full == "euler.cpu" or full.startswith("euler.cpu.")):
            continue
        if module.startswith("euler.gpu.") or full not in ALLOWED_OUTSIDE:
            bad.append(f"{module}: imports {full}")
    return bad


def _modules():
    for path in sorted(EULER.rglob("*.py")):
        parts = path.relative_to(EULER.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def test_no_module_outside_euler_cpu_reaches_a_cpu_kernel():
    bad = [v for module, path in _modules() for v in import_violations(module, path.read_text())]
    assert bad == []


@pytest.mark.parametrize(
    "module, source, ok",
    [
        ("euler.inference.generate", "from euler.cpu import decode", False),
        ("euler.inference.generate", "from euler.cpu.rope import rope_forward", False),
        ("euler.inference.generate", "def f():\n    import euler.cpu.decode", False),
        ("euler.inference.generate", "from euler.cpu.backend import SplitMatmul", False),
        ("euler.inference.generate", "import euler.cpu.backend", False),
        ("euler.gpu.memory", "import euler.cpu", False),
        ("euler.training.loop", "from euler.cpu.backend import CpuBackend", True),
        ("euler.bench.peer", "import euler.cpu", True),
        ("euler.gpu.adamw", "from euler.cpu.adamw import clip_scale", False),
        ("euler.gpu.backend", "from euler.cpu.backend import CpuBackend", False),
        ("euler.gpu.adamw", "from euler.layer_math import clip_scale", True),
        ("euler.cpu.backend", "from euler.cpu import decode", True),
    ],
)
def test_the_import_rules_catch_what_they_forbid(module, source, ok):
    assert (import_violations(module, source) == []) is ok
