"""`euler pipeline`: raw data to a scored, fine-tuned model and its report.md, on the tiny
preset with a few hundred tokens (the numbers are a tiny model's, the sections are all
there); its budget split; and the folder rules, refused before any work."""

from __future__ import annotations

import json
import re

import pytest

from euler import ownership
from euler.pipeline import BUDGET_SAFETY, budgeted_counts, budgeted_text_tokens, split_budget
from tests.train_helpers import raw_data, run_cli

SECTIONS = ("Summary", "Stages", "Data", "Training", "Held-out text", "Instructions",
            "Sample answers", "Loss curves", "Machine", "Versions", "Commands")  # fmt: skip
STAGES = ("data", "sft data", "pretrain", "sft", "eval text", "eval instructions", "plot")
NUMBER = r"\d[\d,]*\.\d+"


TINY = ("--preset", "tiny", "--vocab-size", "300", "--batch-size", "4", "--tokens", "480",
        "--sft-steps", "2", "--limit", "2")  # fmt: skip


def test_pipeline_on_tiny_writes_every_section_with_numbers(tmp_path, monkeypatch, capsys):
    raw = raw_data(tmp_path / "raw")
    out = tmp_path / "out"
    code, stdout, err = run_cli(monkeypatch, capsys, "pipeline", "--data-root", str(raw),
                                "--out", str(out), *TINY)  # fmt: skip
    assert code == 0, err
    report = (out / "report.md").read_text()
    headings = re.findall(r"^## (.+)$", report, re.M)
    assert headings == list(SECTIONS), headings

    def section(name: str) -> str:
        return report.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]

    bpb = re.search(rf"held-out bits per byte \(pretrained, head 0\) \| ({NUMBER}) \|", report)
    assert bpb and 0 < float(bpb.group(1)) < 16, section("Summary")
    for stage in STAGES:
        assert re.search(rf"^\| {stage} \| \d+ min \d\d s \|", section("Stages"), re.M), stage
    for run in ("pretrain", "sft"):
        row = re.search(rf"^\| {run} \| (.+) \|$", section("Training"), re.M).group(1)
        assert "-" not in row.split(" | "), row  # every number present
    assert re.search(rf"\| overall \| \d+ \| [\d,]+ \| {NUMBER} \|", section("Held-out text"))
    assert re.search(r"answers that end with `<\|end\|>` \| \d+\.\d%", section("Instructions"))
    assert section("Sample answers").count("Reference: ") == 2
    assert "- cores: " in section("Machine") and "- numba: " in section("Versions")
    commands = section("Commands")
    assert "euler train --data data/pretrain --out runs/pretrain --preset tiny" in commands
    assert "euler data prepare-sft " + str(raw / "instructions" / "alpaca.json") in commands
    pictures = section("Loss curves")
    try:
        import matplotlib  # noqa: F401

        assert "![loss-pretrain.png](loss-pretrain.png)" in pictures
        assert (out / "loss-pretrain.png").is_file() and (out / "loss-sft.png").is_file()
    except ImportError:
        assert "No plot: matplotlib is not installed" in pictures
    # the folder is a pipeline's, whole, with the runs whose paths hold inside it
    assert ownership.identify(out).kind is ownership.PIPELINE
    assert not (tmp_path / ".out.partial").exists()
    doc = json.loads((out / "pipeline.json").read_text())
    assert [s["name"] for s in doc["stages"]] == list(STAGES)
    assert doc["results"]["pretrain"]["steps"] == 5  # 480 tokens of 4 x 24
    run_json = json.loads((out / "runs" / "sft" / "run.json").read_text())
    assert (out / run_json["train"]["data"]).is_dir(), run_json["train"]["data"]

    # again: refused without --overwrite, the earlier folder untouched
    code, _, err = run_cli(monkeypatch, capsys, "pipeline", "--data-root", str(raw),
                           "--out", str(out), *TINY)  # fmt: skip
    assert code == 2 and "give --overwrite" in err and len(err.splitlines()) == 1, err
    assert (out / "report.md").read_text() == report


@pytest.mark.parametrize("case", ["data folder", "other files", "raw inside", "out is a file"])
def test_pipeline_refuses_before_any_work(case, tmp_path, monkeypatch, capsys):
    raw = raw_data(tmp_path / "raw")
    out = tmp_path / "out"
    out.mkdir()
    if case == "data folder":
        (out / "manifest.json").write_text(json.dumps({"kind": "pretrain"}))
    elif case == "other files":
        (out / "notes.txt").write_text("mine")
    elif case == "raw inside":
        raw.rename(out / "raw")
        raw = out / "raw"
    else:
        out.rmdir()
        out.write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = run_cli(monkeypatch, capsys, "pipeline", "--data-root", str(raw), "--out",
                           str(out), "--overwrite", *TINY)  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: --out"), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_budget_split_and_counts():
    budgets = split_budget(600.0)
    assert budgets == pytest.approx({"pretrain": 420.0, "sft": 90.0, "eval": 90.0})
    tokens, sft_steps = budgeted_counts(budgets, 10_000.0, batch_size=16, context=128)
    per_step = 16 * 128
    assert tokens % per_step == 0
    assert tokens <= 420 * 10_000 * BUDGET_SAFETY < tokens + per_step
    assert sft_steps == int(90 * 10_000 * BUDGET_SAFETY) // (8 * 128)
    assert budgeted_counts({"pretrain": 0.0, "sft": 0.0}, 1.0, 16, 128) == (per_step, 1)


def test_held_out_text_is_cut_to_its_share_of_the_evaluation_budget(tmp_path):
    """With --minutes, `eval --text` scores each source's first tokens that fit half the
    evaluation budget at the forward's estimated speed (a whole val split took 12 minutes
    of a 6-minute pipeline); without, the whole split."""
    from euler.pipeline import FORWARD_SPEEDUP, TEXT_EVAL_SHARE, Settings, training_stages

    budgets = {"pretrain": 420.0, "sft": 90.0, "eval": 90.0}
    n = budgeted_text_tokens(budgets, 10_000.0, sources=2, context=128)
    assert n == int(90 * TEXT_EVAL_SHARE * 10_000 * FORWARD_SPEEDUP * BUDGET_SAFETY) // 2
    assert budgeted_text_tokens({"eval": 0.0}, 1.0, 2, 128) == 129  # one window at least
    settings = Settings(tmp_path / "out", tmp_path / "raw", preset="tiny")
    for cut, flag in ((n, ["--text-tokens", str(n)]), (0, [])):
        stages = {st.name: st for st in training_stages(settings, 24, 480, 2, budgets, cut)}
        (text,) = stages["eval text"].commands
        assert ("--text-tokens" in text) == bool(flag) and text[len(text) - len(flag) :] == flag
        assert all("--text-tokens" not in c for st in stages.values() for c in st.commands
                   if st.name != "eval text")  # fmt: skip


def test_speed_measured_for_the_budget(tmp_path):
    from euler.pipeline import Settings, measure_speed

    settings = Settings(tmp_path / "out", tmp_path / "raw", preset="tiny", batch_size=2)
    assert 0 < measure_speed(settings, vocab_size=300) < 1e9
