"""What a new user sees in the first hour at the terminal: help text printed as written
(Rich markup escaped), `euler --version`, a script-clean `chat --prompt`."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from tests.train_helpers import run_cli


@pytest.mark.parametrize("args", [("--help",), ("serve", "--help")], ids=["euler", "serve"])
def test_help_shows_the_serve_extra_literally(args, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "pip install -e '.[serve]'" in out, out


def test_version_is_the_packages(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "--version")
    assert code == 0, err
    assert out.strip() == f"euler (nanoeuler) {version('nanoeuler')}"


def test_prepare_sft_says_what_share_it_kept_and_why(tmp_path_factory, monkeypatch, capsys):
    """One line: the share kept, each reason records were dropped with its count, and the
    flags that keep more; its numbers are the manifest's."""
    import json

    from euler.data.manifest import read_manifest
    from tests.train_helpers import build_data

    data = build_data(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("sft-kept")
    rambling = " ".join(["the cat sat on a mat and"] * 30)  # no sentence end anywhere
    records = (
        [{"instruction": f"Say {w}.", "input": "", "output": f"{w}."} for w in ("sun", "sky")]
        + [{"instruction": "Tell a story.", "input": "", "output": rambling}] * 3
        + [{"instruction": "Read this. " * 60, "input": "", "output": "Done."}] * 2
    )
    (tmp / "a.json").write_text(json.dumps(records))
    out = tmp / "sft"
    code, stdout, err = run_cli(monkeypatch, capsys, "data", "prepare-sft", str(tmp / "a.json"),
                                "--tokenizer", str(data / "pre"), "--out", str(out),
                                "--context", "64", "--val-fraction", "0")  # fmt: skip
    assert code == 0, err
    (line,) = [x for x in stdout.splitlines() if x.startswith("kept ")]
    m = read_manifest(out)
    assert m["splits"]["train"]["kept"] == 2 and m["splits"]["train"]["dropped_prompt"] == 2
    assert line.startswith("kept 2 of 7 records (29%); dropped 3 whose response is longer")
    assert "2 whose prompt alone fills the 64-token context" in line
    assert "--long truncate keeps 5" in line and "--max-answer" in line and "--context" in line
