"""Fixtures for the train, checkpoint, generate and chat tests: tiny data built in the test.

A 300-token tokenizer is trained on generated sentences, the sentences become pretraining
shards, and a few instruction records become SFT shards; the model is the `tiny` preset
(context 24) with its vocabulary sized to that tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from euler.tokenizer import Tokenizer

from euler.data.corpus import CorpusSource
from euler.data.prepare import prepare_corpus
from euler.data.sft import prepare_sft
from euler.training.config import TrainConfig

WORDS = (
    "the cat dog sat ran on a mat hat red blue green big small quick lazy fox jumps over "
    "under house tree river stone light dark day night sun moon star sky sea wind rain"
).split()


def sentences(n: int, seed: int) -> list[str]:
    """n documents of a few random sentences each."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        sents = [" ".join(rng.choice(WORDS, size=rng.integers(4, 9))) for _ in range(6)]
        docs.append(". ".join(s.capitalize() for s in sents) + ".")
    return docs


_BUILT: dict[str, Path] = {}


def build_data(tmp_path_factory) -> Path:
    """Pretraining folder `pre` (300-token tokenizer) and SFT folder `sft`, built once per session.

    Each test module wraps this in its own `data_root` fixture.
    """
    if "root" in _BUILT:
        return _BUILT["root"]
    root = tmp_path_factory.mktemp("traindata")
    docs = sentences(120, seed=0)
    src = CorpusSource("books", lambda: iter(docs), [{"origin": "generated"}])
    prepare_corpus([src], root / "pre", vocab_size=300, val_fraction=0.2, seed=0)
    records = [
        {"instruction": f"Say {w} twice.", "input": "", "output": f"{w} {w}."} for w in WORDS
    ]
    (root / "alpaca.json").write_text(json.dumps(records))
    tok = Tokenizer.load(root / "pre" / "tokenizer.json")
    prepare_sft([str(root / "alpaca.json")], root / "sft", tok, context=24, val_fraction=0.2,
                progress=False)  # fmt: skip
    _BUILT["root"] = root
    return root


def tiny_config(out: Path, data: Path, **kw) -> TrainConfig:
    """A pretraining run of the tiny preset: 8 steps of 2 x 24 tokens, evaluations every 4."""
    base = dict(
        out_dir=str(out), preset="tiny", data=str(data), batch_size=2, steps=8, lr=1e-2,
        min_lr=1e-3, warmup_steps=2, eval_every=4, eval_batches=2, sample_tokens=4,
        ckpt_every=4, seed=0,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def run_cli(monkeypatch, capsys, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run `euler ARGS` in this process; (exit code, stdout, stderr)."""
    import io

    from euler.cli.main import main

    monkeypatch.setattr(sys, "argv", ["euler", *args])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def raw_data(root: Path) -> Path:
    """A raw-data folder shaped like ../shared/data, small: books/ (four .txt books), web/
    (a JSONL file of 300 documents) and instructions/alpaca.json (one record a word)."""
    docs = sentences(300, seed=1)
    for sub in ("books", "web", "instructions"):
        (root / sub).mkdir(parents=True)
    for i in range(4):
        (root / "books" / f"b{i}.txt").write_text("\n\n".join(docs[i * 10 : (i + 1) * 10]))
    (root / "web" / "c4.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    records = [
        {"instruction": f"Say {w} twice.", "input": "", "output": f"{w} {w}."} for w in WORDS
    ]
    (root / "instructions" / "alpaca.json").write_text(json.dumps(records))
    return root


def one_line_error(code: int, err: str, *words: str) -> None:
    """Assert a CLI call was refused with exit 2 and one `error: ` line holding every word."""
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err
