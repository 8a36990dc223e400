"""`euler tokenizer train/encode/decode/stats` end to end, and one-line errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from euler.cli import commands_tokenizer
from euler.cli.main import main
from euler.tokenizer import Tokenizer
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def run():
    app = typer.Typer()
    commands_tokenizer.register(app)
    runner = CliRunner()
    return lambda *args, stdin=None: runner.invoke(app, ["tokenizer", *args], input=stdin)


def test_train_encode_decode_stats(tmp_path, run):
    text = "The cat sat on the mat. The dog sat on the log.\n" * 200 + "café 東京\n"
    src = tmp_path / "src.txt"
    src.write_text(text, encoding="utf-8")
    out, hf = tmp_path / "tok.json", tmp_path / "hf.json"
    r = run("train", "--vocab-size", "280", "--out", str(out), "--hf", str(hf), str(src))
    assert r.exit_code == 0, r.output
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 280 and tok.sha256 in r.output and hf.is_file()

    msg = tmp_path / "msg.txt"
    msg.write_text("<|user|>The cat sat.<|end|>", encoding="utf-8")
    r = run("encode", "-t", str(out), str(msg))
    assert r.exit_code == 0, r.output
    ids = [int(x) for x in r.output.split()]
    assert ids == tok.encode("<|user|>The cat sat.<|end|>").tolist()
    r = run("encode", "-t", str(out), "--allow-special", str(msg))
    assert [int(x) for x in r.output.split()][0] == tok.user_id

    r = run("decode", "-t", str(out), stdin=" ".join(map(str, ids)))
    assert r.exit_code == 0 and r.output == "<|user|>The cat sat.<|end|>"

    r = run("stats", "-t", str(out), str(src), "--top", "5")
    assert r.exit_code == 0, r.output
    ratio = len(text.encode()) / len(tok.encode(text))
    assert f"{ratio:.3f}" in r.output and "most frequent" in r.output


def test_errors_are_one_line(tmp_path, monkeypatch, capsys):
    good = tmp_path / "a.txt"
    good.write_text("hello world\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"model": {"type": "BPE"}}')
    out = str(tmp_path / "t.json")
    cases = [
        (["train", "--vocab-size", "100", "--out", out, str(good)], "--vocab-size must be"),
        (["train", "--vocab-size", "300", "--out", out, str(empty)], "empty"),
        (["train", "--vocab-size", "300", "--out", out, "nope.txt"], "not found"),
        (["train", "--vocab-size", "300", "--out", str(tmp_path / "no/t"), str(good)], "folder"),
        (["encode", "-t", str(foreign), str(good)], "not a NanoEuler tokenizer"),
        (["decode", "-t", str(tmp_path / "missing.json"), "1"], "not found"),
        (["decode", "-t", str(tmp_path), "1"], "is a folder"),
    ]
    for args, message in cases:
        monkeypatch.setattr(sys, "argv", ["euler", "tokenizer", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (args, err)
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_real_process_prints_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "euler.cli", "tokenizer", "decode", "-t", str(tmp_path), "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path}: is a folder")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
