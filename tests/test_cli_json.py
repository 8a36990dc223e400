"""`--json` wherever a table is printed: the same numbers as JSON, to stdout alone (`-`,
the tables then on stderr) or to a file; and every table whole at 80 columns (no cell or
header cut to an ellipsis)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests.train_helpers import run_cli

ELLIPSIS = "…"


def _json_stdout(monkeypatch, capsys, *args) -> tuple[dict, str]:
    """Run `euler ARGS --json -`: (the JSON that stdout holds alone, stderr)."""
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json", "-")
    assert code == 0, err
    return json.loads(out), err


def test_info_json_is_the_tables_numbers(monkeypatch, capsys):
    from euler.model.config import get_preset

    doc, err = _json_stdout(monkeypatch, capsys, "info", "--preset", "tiny")
    cfg = get_preset("tiny")
    assert doc["report"] == "euler info" and doc["config"] == cfg.to_dict()
    assert doc["parameters"] == cfg.n_params()
    assert f"parameters: {cfg.n_params():,}" in err  # the table went to stderr


def test_kernels_list_json_to_stdout_and_to_a_file(tmp_path, monkeypatch, capsys):
    from euler.gpu import kernel_sources

    doc, err = _json_stdout(monkeypatch, capsys, "kernels", "list")
    generated = [k for k in doc["kernels"] if k["generated"]]
    assert {k["file"] for k in generated} == set(kernel_sources.all_attention_modules())
    assert all(k["file"] in err for k in generated)
    out = tmp_path / "k.json"
    for _ in range(2):  # running it again replaces its own report
        code, stdout, err = run_cli(monkeypatch, capsys, "kernels", "list", "--json", str(out))
        assert code == 0, err
        assert json.loads(out.read_text())["kernels"] == doc["kernels"]
    other = tmp_path / "other.json"
    other.write_text('{"mine": 1}')
    code, _, err = run_cli(monkeypatch, capsys, "kernels", "list", "--json", str(other))
    assert code == 2 and "--json" in err and "never replaces" in err, err
    code, _, err = run_cli(monkeypatch, capsys, "info", "--json", str(out))
    assert code == 2 and "kernels list report" in err, err  # another command's report


def test_data_info_json_matches_the_manifests(data_root, monkeypatch, capsys):
    from euler.data.manifest import read_manifest

    pre, err = _json_stdout(monkeypatch, capsys, "data", "info", str(data_root / "pre"))
    m = read_manifest(data_root / "pre")
    assert pre["kind"] == "pretrain" and pre["sources"] == m["sources"]
    assert pre["totals"] == m["totals"] and "train tokens" in err
    sft, err = _json_stdout(monkeypatch, capsys, "data", "info", str(data_root / "sft"))
    m = read_manifest(data_root / "sft")
    assert sft["kind"] == "sft" and sft["splits"] == m["splits"] and sft["records"] == m["records"]
    assert sft["kept"] in err


def test_tokenizer_stats_json_counts_the_tokens(data_root, tmp_path, monkeypatch, capsys):
    from euler.tokenizer import Tokenizer

    text = "the cat sat on the mat. " * 20
    (tmp_path / "t.txt").write_text(text)
    tokenizer = data_root / "pre" / "tokenizer.json"
    doc, err = _json_stdout(monkeypatch, capsys, "tokenizer", "stats", "-t", str(tokenizer),
                          str(tmp_path / "t.txt"), "--top", "5")  # fmt: skip
    ids = Tokenizer.load(tokenizer).encode(text)
    (row,) = doc["files"]
    assert row["tokens"] == len(ids) and row["bytes"] == len(text.encode())
    assert len(doc["frequent"]) == 5
    assert sum(f["count"] for f in doc["frequent"]) <= len(ids)
    assert doc["frequent"][0]["count"] == max(list(ids).count(i) for i in set(ids.tolist()))
    assert ELLIPSIS not in err  # a long path folds at 80 columns, never cut
    assert "t.txt" in err


def test_eval_json_to_stdout_alone(tmp_path, monkeypatch, capsys):
    from tests.test_eval import _checkpoint

    ck = _checkpoint(tmp_path / "u.safetensors")
    (tmp_path / "t.txt").write_text("Call me Ishmael.")
    doc, err = _json_stdout(monkeypatch, capsys, "eval", "--checkpoint", str(ck), "--text",
                            str(tmp_path / "t.txt"))  # fmt: skip
    assert doc["report"] == "euler eval" and doc["text"]["overall"]["tokens"] > 0
    assert "bits/byte" in err


def _render(table) -> str:
    buf = io.StringIO()
    Console(file=buf, width=80).print(table)
    return buf.getvalue()


def test_tables_fit_80_columns_whole():
    """Long source and file names fold onto more lines; no header or figure is cut."""
    from euler.cli.commands_data import pretrain_table
    from euler.cli.commands_eval import text_table

    long = "../shared/data/web/enwiki-20231101-pages-articles-multistream-part07.jsonl"
    row = {"source": long, "documents": 123_456, "tokens": 12_345_678, "bytes": 45_600_000,
           "nats_per_token": 3.6012, "bits_per_byte": 2.0165, "tokens_per_byte": 0.3712,
           "nats_per_token_mtp_mean": 4.6123}  # fmt: skip
    res = {"checkpoint": "runs/pretrain/checkpoint.safetensors", "context": 1024,
           "mtp_heads": 4, "sources": [row], "overall": {**row, "source": "overall"}}  # fmt: skip
    split = {"train": 12_345_678, "val": 654_321}
    manifest = {"sources": [{"name": long, "weight": None, "documents": split,
                             "text_bytes": split, "tokens": split}]}  # fmt: skip
    eval_words = ("nats/tok", "bits/byte", "MTP mean", "12,345,678")
    pre_words = ("train tokens", "val tokens", "val frac", "by tokens", "12,345,678")
    for table, words in ((text_table(res), eval_words),
                         (pretrain_table("data/pretrain", manifest), pre_words)):  # fmt: skip
        text = _render(table)
        assert ELLIPSIS not in text, text
        assert all(w in text for w in words), text
        assert max(len(line) for line in text.splitlines()) <= 80
        # the first column, read down: a folded name's pieces start each of its lines
        column = "".join(x.split()[0] for x in text.splitlines() if x and not x[0].isspace())
        assert long in column, text


@pytest.mark.parametrize(
    "args",
    [("info", "--preset", "gpu"), ("kernels", "list")],
    ids=["info", "kernels-list"],
)
def test_command_tables_fit_80_columns(args, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert ELLIPSIS not in out and max(len(line) for line in out.splitlines()) <= 80, out
