"""`euler eval --text` against an independent forward pass: the checkpoint exported to a
Hugging Face Llama folder, loaded by `transformers`, scored over the same windows.

    python bench/eval_hf_check.py CHECKPOINT TEXT... [--json FILE]

TEXT is what `euler eval --text` takes (files, folders, a prepared data folder's held-out
split). Prints each source's bits per byte from our engine and from transformers, and their
relative difference; needs the test extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np


def hf_nats(hf, stream: np.ndarray, T: int) -> tuple[float, int]:
    """Sum of next-token cross-entropies (nats) and their count over windows of T + 1
    tokens at stride T, the rule of euler.eval.text.score_stream, one window a forward."""
    import torch

    from euler.eval.text import window_starts

    total, count = 0.0, 0
    with torch.no_grad():
        for s in window_starts(len(stream), T):
            w = torch.tensor(np.asarray(stream[s : s + T + 1]), dtype=torch.long)
            logits = hf(w[None, :-1]).logits[0].double()
            total += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
            count += len(w) - 1
    return total, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("text", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    import transformers

    from euler.cpu.backend import CpuBackend
    from euler.eval.text import evaluate_text, load_text
    from euler.interop.hf_export import export_hf
    from euler.training import checkpoint as ckpt

    torch.set_num_threads(2)
    ck = ckpt.load(args.checkpoint)
    sources = load_text(args.text, ck)
    ours = evaluate_text(ck, sources, CpuBackend())
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(args.checkpoint, Path(tmp) / "hf")
        hf = transformers.LlamaForCausalLM.from_pretrained(Path(tmp) / "hf", dtype=torch.float32)
    hf.eval()
    rows = []
    for src, row in zip(sources, ours["sources"], strict=True):
        nats, n = 0.0, 0
        for stream in src.streams:
            a, b = hf_nats(hf, stream, ck.cfg.context)
            nats, n = nats + a, n + b
        theirs = nats / math.log(2) / src.text_bytes
        rows.append(
            {
                "source": src.name,
                "tokens": n,
                "ours_bits_per_byte": row["bits_per_byte"],
                "transformers_bits_per_byte": theirs,
                "relative_difference": row["bits_per_byte"] / theirs - 1,
            }
        )
        print(
            f"{src.name}: ours {row['bits_per_byte']:.6f}, transformers {theirs:.6f} bits/byte "
            f"({rows[-1]['relative_difference']:+.2e}) over {n:,} tokens"
        )
    if args.json:
        args.json.write_text(json.dumps({"checkpoint": args.checkpoint, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
