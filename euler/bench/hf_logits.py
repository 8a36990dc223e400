"""Our forward's logits against transformers' on the same weights, at a precision, and the
bound each precision must keep (bench/smollm2_check.py and tests/test_smollm2.py's GPU test).

The reference is transformers in float32 on the same device (TF32 off). Beside ours at each
precision runs torch's own forward at that precision (transformers with TF32 products
allowed; the model cast whole to bfloat16). Unit-roundoff bounds (u = 2^-11 for TF32 inputs,
2^-8 for bf16, times gamma_n growth over reductions of 576-1,536 terms and 30 layers) exceed
the logits themselves, so the bound is measured: ours within BOUND_FACTOR times torch's own
max |error| at that precision on the same window; fp32 within FP32_REL of the largest logit.
torch and transformers are imported when called: neither is a dependency of the package.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

# ours may round operands torch's keeps in fp32 (TF32 attention on tensor cores) and torch
# rounds what ours keeps (bf16 residual stream): a small multiple, fixed before measuring
BOUND_FACTOR = 4.0
FP32_REL = 1e-4  # fp32: max |difference| / max |logit|, the CPU bound


def errors(logits, ref) -> dict:
    """logits against ref, both (T, V) torch tensors on one device: max |difference|, that
    over max |ref|, the root mean square difference, and the share of equal argmaxes."""
    d = (logits.float() - ref).abs()
    agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
    return {"max_abs": float(d.max()), "rel": float(d.max() / ref.abs().max()),
            "rms": float(d.square().mean().sqrt()), "argmax_agree": float(agree)}  # fmt: skip


def precision_windows(ck, ids: np.ndarray, path: Path, args) -> dict:
    """Per precision (args.precision) and window (args.windows, the first T of `ids`): our
    logits and torch's own at that precision, each against transformers' float32 forward
    of the GGUF file `path` on args.device; ours within the bound or not."""
    import torch
    import transformers

    from euler.backend import make_backend
    from euler.model.transformer import Model

    dev = args.device
    fp32 = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16).to(dev)  # whole model, residual included
    fp32 = fp32.to(dev)

    def torch_logits(window: np.ndarray, precision: str):
        # "high" lets float32 products run on TF32 tensor cores; "highest" keeps them fp32
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        with torch.no_grad():
            model = bf16 if precision == "bf16" else fp32
            return model(torch.from_numpy(window[None]).long().to(dev)).logits[0].float()

    windows = {T: ids[:T].astype(np.int32) for T in args.windows}
    refs = {T: torch_logits(w, "fp32") for T, w in windows.items()}
    out: dict = {"device": dev, "bound_factor": BOUND_FACTOR, "fp32_rel_bound": FP32_REL}
    if dev == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    for prec in args.precision:
        model = Model(ck.cfg, make_backend(dev, prec), flat_params=ck.params, precision=prec)
        rows = {}
        for T, window in windows.items():
            t0 = time.perf_counter()
            model.forward(window[None])
            ours = torch.from_numpy(model.head_logits(0)[0]).to(dev)
            seconds = time.perf_counter() - t0
            e, t = errors(ours, refs[T]), errors(torch_logits(window, prec), refs[T])
            ok = (e["rel"] <= FP32_REL if prec == "fp32"
                  else e["max_abs"] <= BOUND_FACTOR * t["max_abs"])  # fmt: skip
            rows[T] = {"ours": e, "torch": t, "within_bound": ok, "seconds_ours": seconds,
                       "ratio_max_abs": e["max_abs"] / t["max_abs"] if t["max_abs"] else None,
                       "ratio_rms": e["rms"] / t["rms"] if t["rms"] else None}  # fmt: skip
            print(f"{prec} T={T}: ours max|d| {e['max_abs']:.3e} (rel {e['rel']:.2e}, rms "
                  f"{e['rms']:.2e}, argmax {e['argmax_agree']:.4f}); torch's own {prec} "
                  f"{t['max_abs']:.3e} (rms {t['rms']:.2e}, argmax {t['argmax_agree']:.4f}); "
                  f"within bound: {ok}; forward {seconds:.2f} s (first compiles)")  # fmt: skip
        out[prec] = rows
        del model
    return out
