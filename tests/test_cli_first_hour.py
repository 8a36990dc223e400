"""What a new user sees in the first hour at the terminal: help text printed as written
(Rich markup escaped), `euler --version`, a script-clean `chat --prompt`."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from euler.training.terminal import FIRST_STEP_EXTRA
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
                                "--seq-len", "64", "--val-fraction", "0")  # fmt: skip
    assert code == 0, err
    (line,) = [x for x in stdout.splitlines() if x.startswith("kept ")]
    m = read_manifest(out)
    assert m["splits"]["train"]["kept"] == 2 and m["splits"]["train"]["dropped_prompt"] == 2
    assert line.startswith("kept 2 of 7 records (29%); dropped 3 whose response is longer")
    assert "2 whose prompt alone fills the 64-token context" in line
    assert "--long truncate keeps 5" in line and "--max-answer" in line and "--seq-len" in line


def _train_output(tmp_path_factory, terminal: bool, steps: int = 4, monkeypatch=None,
                  cached: bool | None = None):  # fmt: skip
    """(printed text, summary, metrics) of a tiny run on a console of that kind; cached:
    what the run is told of Numba's cache (None: the truth)."""
    if cached is not None:
        from euler.training import loop

        monkeypatch.setattr(loop, "kernels_compiled", lambda: cached)
    import io

    from rich.console import Console

    from euler.training.loop import train
    from tests.train_helpers import build_data, read_metrics, tiny_config

    data = build_data(tmp_path_factory)
    out = tmp_path_factory.mktemp("progress") / "run"
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal, width=160, soft_wrap=True)  # as train()
    tc = tiny_config(out, data / "pre", steps=steps, log_every=1, eval_every=steps)
    summary = train(tc, console=console)
    return buf.getvalue(), summary, read_metrics(out)


def test_no_loss_or_speed_before_the_first_step_and_the_compile_apart(
    tmp_path_factory, monkeypatch
):
    from euler.training.terminal import COMPILING

    text, summary, metrics = _train_output(tmp_path_factory, terminal=False,
                                           monkeypatch=monkeypatch, cached=False)  # fmt: skip
    lines = text.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("step 1/"))
    before = "\n".join(lines[:first])
    assert COMPILING in before and "nan" not in before and "tok/s" not in before
    assert "ETA" not in before
    assert "first step" in lines[first] and "tok/s" not in lines[first]
    assert all("tok/s" in x and "ETA" in x for x in lines if x.startswith(("step 2/", "step 4/")))
    # tokens/s over the steps after the first, the first step's time apart
    steps = [m for m in metrics if "tok_s" in m]
    per_step = summary["train_tokens"] / len(steps)
    later = sum(per_step / m["tok_s"] for m in steps[1:])
    assert abs(summary["tokens_per_second"] / ((len(steps) - 1) * per_step / later) - 1) < 1e-9
    assert abs(summary["first_step_seconds"] - per_step / steps[0]["tok_s"]) < 1e-9
    (done,) = [x for x in lines if x.startswith("done:")]
    assert f"{summary['tokens_per_second']:,.0f} tokens/s after the first step" in done
    assert f"(which took {summary['first_step_seconds']:.1f} s, {FIRST_STEP_EXTRA})" in done


def test_the_progress_bar_says_it_compiles_and_never_shows_nan(tmp_path_factory, monkeypatch):
    from euler.training.terminal import COMPILING

    text, _, _ = _train_output(tmp_path_factory, terminal=True, monkeypatch=monkeypatch,
                               cached=False)  # fmt: skip
    assert COMPILING in text and "nan" not in text and "-:--:--" not in text


def test_the_notice_gives_the_last_cold_starts_seconds_or_says_the_cache_loads(
    tmp_path_factory, monkeypatch
):
    """A cold start records its seconds to the first step; the next cold start's notice
    gives them; a warm one says the kernels load from the cache and records nothing."""
    from euler.cache import COMPILE_RECORD, last_compile_seconds
    from euler.training.terminal import COMPILING, LOADING

    cache = tmp_path_factory.mktemp("euler-cache")
    monkeypatch.setenv("EULER_CACHE", str(cache))
    text, summary, _ = _train_output(tmp_path_factory, False, 2, monkeypatch, cached=False)
    assert f"{COMPILING}; later runs load them from the cache)" in text
    seconds = last_compile_seconds()
    assert seconds is not None and seconds >= summary["first_step_seconds"]
    text, _, _ = _train_output(tmp_path_factory, False, 2, monkeypatch, cached=False)
    assert f"{COMPILING}, about {seconds:.0f} s last time; later runs load" in text
    (cache / COMPILE_RECORD).write_text('{"seconds": 99}')
    text, _, _ = _train_output(tmp_path_factory, False, 2, monkeypatch, cached=True)
    assert LOADING in text and COMPILING not in text
    assert last_compile_seconds() == 99.0  # a warm start keeps the cold one's record
    (cache / COMPILE_RECORD).write_text("not json")
    assert last_compile_seconds() is None


def test_the_headline_validation_loss_is_next_token(tmp_path_factory):
    """Validation lines and the summary lead with head 0's loss (what other projects
    report), the heads' mean beside it, labelled."""
    text, summary, metrics = _train_output(tmp_path_factory, terminal=False)
    heads = [m["val_loss_heads"] for m in metrics if "val_loss_heads" in m]
    assert summary["val_loss_next_token"] == summary["val_loss_heads"][0] == heads[-1][0]
    (last,) = [x for x in text.splitlines() if x.startswith("step 4: val loss")]
    assert last.startswith(f"step 4: val loss {heads[-1][0]:.4f} (next token; mean of the 4 ")
    (done,) = [x for x in text.splitlines() if x.startswith("done:")]
    assert f"val loss {summary['val_loss_next_token']:.4f} (next token; " in done


def test_an_overlaid_plot_names_each_runs_tokens_per_step():
    from euler.cli.plot import Curves, title

    pre = Curves("pre", [1], [5.0], [], 2048.0)
    sft = Curves("sft", [1], [3.0], [], 1032.0)
    assert title([pre]) == "next-token loss, pre: 2,048 tokens per step"
    assert title([pre, Curves("pre2", [1], [5.0], [], 2048.0)]).endswith(": 2,048 tokens per step")
    assert (
        title([pre, sft]) == "next-token loss, pre (2,048 tokens/step) vs sft (1,032 tokens/step)"
    )


def test_the_plots_headline_is_next_token_validation_loss():
    """Head 0's validation loss is drawn and labelled as next token, the MTP heads' mean
    beside it and the training loss labelled as that mean (with one head: next token)."""
    from euler.cli.plot import Curves, series

    val = [(2, 4.6, 3.6), (4, 4.4, 3.4)]  # (step, mean over heads, head 0)
    run = Curves("pre", [1, 2, 3, 4], [5.0, 4.8, 4.6, 4.5], val, 2048.0, heads=4)
    lines = {s.label: s for s in series([run])}
    assert lines["validation, next token (head 0)"].values == [3.6, 3.4]
    assert lines["validation, mean of the MTP heads"].values == [4.6, 4.4]
    assert lines["training, mean of the MTP heads (EMA 0.95)"].steps == [1, 2, 3, 4]
    one = Curves("k1", [1, 2], [5.0, 4.0], [(2, 3.9, 3.9)], 512.0, heads=1)
    labels = [s.label for s in series([run, one])]
    assert "k1: training, next token (EMA 0.95)" in labels
    assert "k1: validation, next token (head 0)" in labels
    assert "k1: validation, mean of the MTP heads" not in labels  # the same line, drawn once
    assert "pre: validation, next token (head 0)" in labels
    # overlaid, each run stops at the last step they all reached
    assert all(max(s.steps) <= 2 for s in series([run, one]))


def test_the_prepare_sft_table_fits_80_columns(tmp_path_factory):
    """Every header and figure whole at 80 columns (no cell cut to an ellipsis)."""
    import io

    from euler.cli.commands_data import sft_table
    from rich.console import Console

    split = {"records": 52_002, "whole": 12_345, "cut": 23_456, "truncated": 0,
             "dropped": 16_201, "windows": 20_000, "records_per_window": 1.78,
             "tokens": 12_560_000, "loss_fraction_of_windows": 0.379}  # fmt: skip
    m = {"context": 128, "records": 54_738, "too_long_rule": "cut", "splits":
         {"train": split, "val": split}, "policy": {"max_answer": 40, "pack": True}}  # fmt: skip
    buf = io.StringIO()
    Console(file=buf, width=80).print(sft_table(m))
    text = buf.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    assert "12,560,000" in text and "records" in text and "rec/win" in text


def test_eval_tables_fit_80_columns(tmp_path_factory):
    """A long source name is folded, never cut; the instruction metrics are one a row."""
    import dataclasses
    import io
    import json
    import shutil

    from euler.cli.commands_eval import _eval_instructions, _eval_text
    from euler.tokenizer import Tokenizer
    from rich.console import Console

    from euler.model.config import get_preset
    from euler.model.params import ParamLayout, init_params
    from euler.training import checkpoint
    from tests.train_helpers import build_data

    data = build_data(tmp_path_factory)
    deep = tmp_path_factory.mktemp("a-folder-with-a-rather-long-name") / "and-deeper" / "pre"
    shutil.copytree(data / "pre", deep)
    tok = Tokenizer.load(deep / "tokenizer.json")
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=tok.vocab_size)
    path = deep.parent / "ck.safetensors"
    checkpoint.save(path, cfg, init_params(ParamLayout(cfg), 0), None, {"step": 0}, {},
                    tok.to_json())  # fmt: skip
    ck = checkpoint.load(path)
    buf = io.StringIO()
    console = Console(file=buf, width=80)
    _eval_text(ck, [deep], "cpu", "fp32", console)
    records = json.loads((data / "alpaca.json").read_text())[:2]
    _eval_instructions(ck, records, data / "alpaca.json", 4, "cpu", "fp32", console)
    text = buf.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    assert "references that loop in their first 4 tokens" in text


def test_kernels_count_as_compiled_once_numbas_cache_holds_an_index(tmp_path, monkeypatch):
    import numba

    from euler.cache import kernels_compiled

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    assert not kernels_compiled()  # no folder yet
    (tmp_path / "numba" / "cpu_x").mkdir(parents=True)
    (tmp_path / "numba" / "cpu_x" / "rmsnorm.rmsnorm_forward-10.py311.1.nbc").write_bytes(b"")
    assert not kernels_compiled()  # data without its index is not loaded
    (tmp_path / "numba" / "cpu_x" / "rmsnorm.rmsnorm_forward-10.py311.nbi").write_bytes(b"")
    assert kernels_compiled()


def test_the_eta_is_the_steps_left_at_the_speed_after_the_first_step(tmp_path_factory, monkeypatch):
    """Each shown ETA: steps left x (seconds of the steps after the first / their count), the
    step times read back from metrics.jsonl; none before a second step has run."""
    from euler.training.terminal import Display

    shown = []
    real = Display.step

    def record(self, step, total, loss, lr, tps, eta, first_seconds=None):
        shown.append((step, total, eta))
        real(self, step, total, loss, lr, tps, eta, first_seconds)

    monkeypatch.setattr(Display, "step", record)
    _, summary, metrics = _train_output(tmp_path_factory, terminal=False,
                                        monkeypatch=monkeypatch, steps=5)  # fmt: skip
    per_step = summary["train_tokens"] / 5
    seconds = [per_step / m["tok_s"] for m in metrics if "tok_s" in m]
    assert [s for s, _, _ in shown] == [1, 2, 3, 4, 5]
    assert shown[0][2] is None
    for step, total, eta in shown[1:]:
        expected = (total - step) * sum(seconds[1:step]) / (step - 1)
        assert eta == pytest.approx(expected, rel=1e-9, abs=1e-12), (step, eta, expected)
