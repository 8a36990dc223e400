"""`euler tokenizer train/encode/decode/stats` end to end, and one-line errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys

from euler.tokenizer import Tokenizer


def euler(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "euler.cli", "tokenizer", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_encode_decode_stats(tmp_path):
    text = "The cat sat on the mat. The dog sat on the log.\n" * 200 + "café 東京\n"
    src = tmp_path / "src.txt"
    src.write_text(text, encoding="utf-8")
    out, hf = tmp_path / "tok.json", tmp_path / "hf.json"
    r = euler("train", "--vocab-size", "280", "--out", str(out), "--hf", str(hf), str(src))
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 280 and tok.sha256 in r.stdout and hf.is_file()

    msg = tmp_path / "msg.txt"
    msg.write_text("<|user|>The cat sat.<|end|>", encoding="utf-8")
    r = euler("encode", "-t", str(out), str(msg))
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stdout.split()]
    assert ids == tok.encode("<|user|>The cat sat.<|end|>").tolist()
    r = euler("encode", "-t", str(out), "--allow-special", str(msg))
    assert [int(x) for x in r.stdout.split()][0] == tok.user_id

    r = euler("decode", "-t", str(out), stdin=" ".join(map(str, ids)))
    assert r.returncode == 0 and r.stdout == "<|user|>The cat sat.<|end|>"

    r = euler("stats", "-t", str(out), str(src), "--top", "5")
    assert r.returncode == 0, r.stderr
    ratio = len(text.encode()) / len(tok.encode(text))
    assert f"{ratio:.3f}" in r.stdout and "most frequent" in r.stdout


def test_errors_are_one_line(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("hello world\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"model": {"type": "BPE"}}')
    cases = [
        (["train", "--vocab-size", "100", "--out", str(tmp_path / "t"), str(good)], "too small"),
        (["train", "--vocab-size", "300", "--out", str(tmp_path / "t"), str(empty)], "empty"),
        (["train", "--vocab-size", "300", "--out", str(tmp_path / "t"), "nope.txt"], "not found"),
        (["train", "--vocab-size", "300", "--out", str(tmp_path / "no/t"), str(good)], "folder"),
        (["encode", "-t", str(foreign), str(good)], "not a NanoEuler tokenizer"),
        (["decode", "-t", str(tmp_path / "missing.json"), "1"], "not found"),
    ]
    for args, message in cases:
        r = euler(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and message in r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
