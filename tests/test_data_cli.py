"""`euler data ...` from the shell: a tiny preparation, and bad input as one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def euler(*args: str, cwd=None) -> subprocess.CompletedProcess:
    code = "from euler.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    text = "It was the best of times, it was the worst of times. " * 40
    (root / "book.txt").write_text(
        f"*** START OF THE PROJECT GUTENBERG EBOOK T ***\n{text}\n*** END OF THE PROJECT GUTENBERG"
    )
    (root / "web.jsonl").write_text(
        "".join(json.dumps({"text": f"page {i}. {text}"}) + "\n" for i in range(30))
    )
    records = [{"instruction": f"Count to {i}.", "input": "", "output": "1 2 3"} for i in range(30)]
    (root / "alpaca.json").write_text(json.dumps(records))
    return root


def test_prepare_then_prepare_sft(inputs):
    r = euler(
        "data", "prepare", "--books", str(inputs / "book.txt"), "--web",
        str(inputs / "web.jsonl"), "--vocab-size", "300", "--web-weight", "2",
        "--out", str(inputs / "pre"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "MB/s" in r.stdout and "val frac" in r.stdout
    manifest = json.loads((inputs / "pre" / "manifest.json").read_text())
    assert [s["weight"] for s in manifest["sources"]] == [1.0, 2.0]

    r = euler(
        "data", "prepare-sft", str(inputs / "alpaca.json"), "--tokenizer", str(inputs / "pre"),
        "--out", str(inputs / "sft"), "--seq-len", "32",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "whole" in r.stdout and "dropped" in r.stdout and "windows" in r.stdout
    assert (inputs / "sft" / "sft-train.mask.bin").is_file()
    r = euler("data", "info", str(inputs / "sft"))
    assert r.returncode == 0 and "sft data, tokenizer V=300" in r.stdout and "whole" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data", "prepare", "--out", "o", "--vocab-size", "300"], "at least one --books"),
        (["data", "prepare", "--out", "o", "--books", "missing.txt", "--vocab-size", "300"],
         "books input not found: missing.txt"),
        (["data", "prepare-sft", "missing.json", "--out", "o", "--tokenizer", "nope.json"],
         "tokenizer file not found"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(tmp_path, args, message):
    r = euler(*args, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: ") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
