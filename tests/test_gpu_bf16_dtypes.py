"""The bf16 RoPE, cross-entropy and AdamW launchers refuse the dtypes the model never passes
them (euler.precision.BF16_TENSORS), naming the argument. The checks come before any launch,
so host arrays do and no GPU is needed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from euler.gpu import adamw, cross_entropy, rope  # noqa: E402

H, G, E, B, T, N, V, P = 4, 2, 16, 1, 2, 3, 16, 16


def _z(dtype, *shape) -> np.ndarray:
    return np.zeros(shape, dtype)


def _rope(fn, x, table=np.float32, **kw):
    return lambda: fn(x, _z(table, T, E // 2), _z(table, T, E // 2), H, G, E, **kw)


def _adamw(grads=np.float32, lowp=np.uint16):
    f = _z(np.float32, P)
    return lambda: adamw.adamw_update(f, _z(grads, P), f, f, _z(np.float64, 2), _z(np.float64, 3),
                                      0.9, 0.95, 1e-8, 0.1, 8, lowp=_z(lowp, P))  # fmt: skip


QKV = (B, T, (H + 2 * G) * E)
TARGETS = _z(np.int32, N)
CASES = {
    "cos, sin": _rope(rope.rope_forward, _z(np.uint16, *QKV), table=np.float64),
    "qkv": _rope(rope.rope_forward, _z(np.float64, *QKV)),
    "dqkv": _rope(rope.rope_backward, _z(np.uint16, *QKV), out=_z(np.uint16, *QKV)),
    "out": _rope(rope.rope_backward, _z(np.float32, *QKV), out=_z(np.float32, *QKV)),
    "losses": lambda: cross_entropy.cross_entropy_forward(
        _z(np.uint16, N), _z(np.uint16, N, V), TARGETS
    ),
    "logits": lambda: cross_entropy.cross_entropy_forward_backward(
        _z(np.float32, N), _z(np.float64, N, V), TARGETS, np.ones(2), 1
    ),
    "grads": _adamw(grads=np.uint16),
    "lowp": _adamw(lowp=np.float32),
}


@pytest.mark.parametrize("name", CASES)
def test_launcher_refuses_a_dtype_naming_it(name) -> None:
    with pytest.raises(ValueError, match=rf": {name} (is|are) "):
        CASES[name]()
