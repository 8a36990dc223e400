"""Compile kernels that the test session needs only after its first minutes into Numba's
on-disk cache, in a process beside the session (conftest.py starts it when a default
selection of the whole suite starts).

On a fresh machine the session compiles about 140 s of CPU kernels on its own core
(measured on the 2-core machine with numba's compile events). The ones it reaches first
(the tokenizer's, then the float32 training step's, within its first two minutes) it keeps:
this process would still be compiling them when the session needs them, and both would
compile them. The rest (the float64 step, FlashAttention in both precisions, float64
AdamW, float32 decoding, the bf16 conversions) this process compiles first, and the
session loads them from the cache. Nothing here is checked: a kernel this process has not
finished is compiled by the session as before, with the same code.

Run: `python -m tests.prewarm` from the repository root.
"""

from __future__ import annotations

import numpy as np


def _model_step(dtype) -> None:
    """A tiny model's forward, backward, evaluation loss and AdamW step in dtype."""
    from euler.bench.steps import synthetic_batch
    from euler.model.config import get_preset
    from euler.model.transformer import Model
    from euler.training.optim import AdamW, AdamWConfig

    cfg = get_preset("tiny")
    tokens, targets = synthetic_batch(cfg, 2, 16)
    model = Model(cfg, dtype=dtype, seed=1)
    model.forward(tokens, targets, need_grad=True)
    model.backward()
    model.forward(tokens, targets, need_grad=False)
    AdamW(model, AdamWConfig(weight_decay=0.1, grad_clip=0.5)).step(lr=0.01)


def _flash_attention(dtype) -> None:
    """FlashAttention's forward and backward (a tile, as gradcheck and the dense test ask)."""
    from euler.cpu.backend import CpuBackend

    B, T, H, G, E = 2, 20, 4, 2, 8
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((B, T, (H + 2 * G) * E)).astype(dtype)
    dout = rng.standard_normal((B, T, H * E)).astype(dtype)
    out, lse = np.zeros((B, T, H * E), dtype), np.zeros((B, H, T), dtype)
    be = CpuBackend(attention_tile=16)
    be.attention_forward(out, lse, qkv, H, G, E)
    be.attention_backward(np.zeros_like(qkv), dout, qkv, out, lse, H, G, E)


def _decode() -> None:
    """A few float32 tokens through the KV cache, and the bf16 conversions."""
    from euler.cpu.bf16 import narrow_into, widen
    from euler.inference.generate import Decoder
    from euler.model.config import get_preset
    from euler.model.params import ParamLayout, init_params

    cfg = get_preset("tiny")
    dec = Decoder(cfg, init_params(ParamLayout(cfg), 0))
    dec.logits(dec.feed([1, 2, 3]))
    bits = np.zeros(8, np.uint16)
    narrow_into(bits, np.ones(8, np.float32))
    widen(bits)


def main() -> None:
    import euler  # noqa: F401  (its Numba cache folder, before any kernel is defined)

    _model_step(np.float64)
    _flash_attention(np.float64)
    _flash_attention(np.float32)
    _decode()


if __name__ == "__main__":
    main()
