"""Fine-tuning and evaluating an imported model, end to end on the CPU.

The tiny tied Llama of test_import_pretrained.py (made by transformers inside the test, a
byte-level BPE trained by `tokenizers`, SmolLM2's ChatML template) is imported, then:
`euler data prepare-sft --tokenizer RUN` renders Alpaca records with the checkpoint's own
tokenizer and ChatML template, `euler sft --checkpoint RUN` takes a few steps (loss on response
tokens and their <|im_end|> only; at the data's context when the model's is longer), and
`euler eval --instructions` answers the held-out records with that template, stopping on
<|im_end|>.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from euler.data import SFTDataset  # noqa: E402
from euler.data.chat_template import encode_prompt, end_token  # noqa: E402
from euler.data.sft import load_alpaca  # noqa: E402
from euler.interop.hf_import import import_hf  # noqa: E402
from euler.training import checkpoint as ckpt  # noqa: E402
from tests.test_import_pretrained import euler_cli, folder  # noqa: E402, F401

ALPACA = (
    Path(__file__).resolve().parents[2] / "shared/data/instructions/alpaca_data_subset2000.json"
)
# distinct records: the held-out split is drawn by each record's hash, and four records
# repeated drew none of them
FALLBACK = [
    {
        "instruction": "Add the numbers.",
        "input": f"{i} and {i + 3}",
        "output": f"{i} + {i + 3} = {2 * i + 3}.",
    }
    for i in range(24)
]


def _records(tmp_path: Path, n: int = 24) -> Path:
    """n Alpaca records, the shared set's with the shortest answers (else a few written
    here)."""
    recs = FALLBACK
    if ALPACA.is_file():
        recs = sorted(load_alpaca(ALPACA), key=lambda r: len(r["output"]))
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(recs[:n]), encoding="utf-8")
    return path


def test_prepare_sft_sft_and_eval_on_an_imported_model(folder, tmp_path, euler_cli) -> None:  # noqa: F811
    src, _, fast = folder
    run = tmp_path / "run"
    run.mkdir()
    import_hf(src, run / ckpt.CHECKPOINT_NAME, context=1024)  # a working context beyond the data's
    tok = ckpt.read_tokenizer(run)  # from the header alone
    assert tok.sha256 == ckpt.load(run).tokenizer_sha256 and end_token(tok) == "<|im_end|>"
    start, end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    alpaca = _records(tmp_path)

    # prepare-sft with the run folder's (or its checkpoint's) tokenizer and template
    sft = tmp_path / "sft"
    assert euler_cli("data", "prepare-sft", alpaca, "--out", sft, "--tokenizer", run,
                     "--seq-len", 256, "--val-fraction", 0.25) == 0  # fmt: skip
    assert euler_cli("data", "prepare-sft", alpaca, "--out", tmp_path / "sft2", "--tokenizer",
                     run / ckpt.CHECKPOINT_NAME, "--seq-len", 256,
                     "--val-fraction", 0.25) == 0  # fmt: skip
    for name in ("sft-train.tokens.bin", "sft-val.tokens.bin", "tokenizer.json"):
        assert (sft / name).read_bytes() == (tmp_path / "sft2" / name).read_bytes()
    assert euler_cli("data", "verify", sft) == 0  # the foreign tokenizer re-read and checked
    data = SFTDataset(sft, "train", vocab_size=tok.vocab_size)
    ids, mask = np.asarray(data.tokens), np.asarray(data.mask)
    assert (ids == start).any() and (ids == end).any()
    assert not mask[ids == start].any()  # the template's tags are never learned...
    ends = mask[ids == end]
    assert ends.any() and not ends.all()  # ...but the answer's closing <|im_end|> is
    # each record starts with its ChatML prompt, equal to apply_chat_template's
    heldout = json.loads((sft / "val-instructions.json").read_text())
    prompts = []
    for rec in (r for r in load_alpaca(alpaca) if r not in heldout):
        user = rec["instruction"] + (f"\n\n{rec['input']}" if rec["input"] else "")
        want = fast.apply_chat_template([{"role": "user", "content": user}],
                                        add_generation_prompt=True, return_dict=True)  # fmt: skip
        prompts.append(encode_prompt(tok, rec["instruction"], rec["input"]).tolist())
        assert prompts[-1] == list(want["input_ids"])
    assert len(data.starts) == json.loads((sft / "manifest.json").read_text())["splits"][
        "train"]["kept"]  # fmt: skip
    for s in data.starts:
        assert any(ids[s : s + len(p)].tolist() == p for p in prompts)

    # a few SFT steps from the imported checkpoint: finite losses, the template kept
    out = tmp_path / "sft-run"
    assert euler_cli("sft", "--checkpoint", run, "--data", sft, "--out", out, "--steps", 3,
                     "--batch-size", 2, "--warmup-steps", 1, "--eval-every", 3,
                     "--ckpt-every", 3) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r] + [r["val_loss"] for r in rows
                                                          if "val_loss" in r]  # fmt: skip
    assert len(losses) >= 5 and all(math.isfinite(v) for v in losses)
    # the steps run at the data's 256 tokens, not the model's 1,024 (that is, padding)
    assert [r["tokens"] for r in rows if "tokens" in r] == [512, 1024, 1536]  # B=2 x T=256
    tuned = ckpt.load(out)
    assert tuned.step == 3 and tuned.tokenizer_sha256 == tok.sha256
    assert tuned.cfg.tie_embeddings

    # eval --instructions renders with the checkpoint's ChatML and stops on <|im_end|>
    report = tmp_path / "eval.json"
    assert euler_cli("eval", "--checkpoint", out, "--instructions", sft / "val-instructions.json",
                     "--max-tokens", 8, "--json", report) == 0  # fmt: skip
    res = json.loads(report.read_text())["instructions"]
    assert res["end_token"] == "<|im_end|>" and res["records"] == len(heldout) > 0
    for a in res["answers"]:
        assert "<|im_end|>" not in a["answer"] and a["tokens"] <= 8


def test_tokenizer_commands_take_an_imported_run(folder, tmp_path, capsys, euler_cli) -> None:  # noqa: F811
    """`euler tokenizer encode/decode/stats -t RUN` use the checkpoint's foreign tokenizer
    (the run folder or its checkpoint), ids equal `tokenizers`'."""
    src, _, fast = folder
    run = tmp_path / "run"
    run.mkdir()
    import_hf(src, run / ckpt.CHECKPOINT_NAME)
    text = "What is the capital of France? 1999 naïve café\n"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    want = fast(text, add_special_tokens=False)["input_ids"]
    for where in (run, run / ckpt.CHECKPOINT_NAME):
        capsys.readouterr()
        assert euler_cli("tokenizer", "encode", "-t", where, tmp_path / "t.txt") == 0
        assert list(map(int, capsys.readouterr().out.split())) == want
    assert euler_cli("tokenizer", "decode", "-t", run, *want) == 0
    assert capsys.readouterr().out == text
    assert euler_cli("tokenizer", "stats", "-t", run, tmp_path / "t.txt") == 0
