"""The README's first hour, its commands in order: every fenced bash block of the Set up and
Usage sections, parsed from README.md and run in a scratch folder (in this process, through
`euler`'s own entry point), must succeed.

Cheap by rewriting, never by skipping: the shared raw data (../shared/data) becomes a small
folder built here (tests/train_helpers.raw_data), the embedded default corpus that the
Set-up's `euler train` uses becomes 60 pydoc topics in a scratch cache, and the counts that
make a real run long are replaced (REWRITES: 10M tokens -> 4,096, 300 SFT steps -> 2, a
200-step warmup -> 1, a 512-token tokenizer -> 300, and the Set-up's train gets --steps 2).
Every rewrite must apply once, so a README whose commands change without this test fails it.
Not run: `pip install` (the suite runs inside the installed package) and scripts/test.sh
(the suite itself); `euler plot` needs the plot extra and must, without it, say so in one line.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import shlex
from pathlib import Path

from euler.data import default_corpus
from euler.data.corpus import CorpusSource
from tests.train_helpers import raw_data, run_cli

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("Set up", "Usage: pretrain, fine-tune, chat")
# (command, flag or argument, README's value, the test's): each must be met exactly once
REWRITES = [
    ("train", "--tokens", "10000000", "4096"),
    ("train", "--warmup-steps", "200", "1"),
    ("sft", "--steps", "300", "2"),
    ("prepare", "--vocab-size", "512", "300"),
]
SKIPPED = ("pip install", "scripts/test.sh")


def readme_commands() -> list[str]:
    """The shell commands of the SECTIONS' bash blocks, in order: continuation lines joined,
    `&&` chains split, comments dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for title in SECTIONS:
        body = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```bash\n(.*?)```", body, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = shlex.join(shlex.split(line, comments=True))
                commands += [c.strip() for c in line.split(" '&&' ") if c.strip()]
    return commands


def rewrite(argv: list[str], raw: Path, used: list[tuple]) -> list[str]:
    """argv with the shared data's paths pointing into raw and REWRITES applied."""
    out = []
    for arg in argv:
        if arg.startswith("../shared/data/"):
            local = str(raw / arg.removeprefix("../shared/data/"))
            out += sorted(glob.glob(local)) if "*" in local else [local]
        else:
            out.append(arg)
    for rule in REWRITES:
        command, flag, old, new = rule
        for i in range(1, len(out)):
            if out[i - 1] == flag and out[i] == old and command in out[:2]:
                out[i] = new
                used.append(rule)
    return out


def test_readme_commands_run_in_order(tmp_path, monkeypatch, capsys):
    raw = raw_data(tmp_path / "raw")
    work = tmp_path / "checkout"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("EULER_CACHE", str(tmp_path / "cache"))
    topics = list(default_corpus.pydoc_topics())[:60]
    monkeypatch.setattr(default_corpus, "default_sources",
                        lambda: [CorpusSource("pydoc-topics", lambda: iter(topics))])  # fmt: skip
    commands = readme_commands()
    assert any(c.startswith("euler train --out runs/first") for c in commands), commands
    ran, used = [], []
    for command in commands:
        if command.startswith(SKIPPED):
            continue
        argv = shlex.split(command)
        assert argv[0] == "euler", f"the README runs {command!r}, which this test cannot"
        argv = rewrite(argv[1:], raw, used)
        if argv[:3] == ["train", "--out", "runs/first"]:
            argv += ["--steps", "2"]
        code, out, err = run_cli(monkeypatch, capsys, *argv)
        if argv[0] == "plot" and importlib.util.find_spec("matplotlib") is None:
            assert code == 2 and "pip install -e '.[plot]'" in err, err
        else:
            assert code == 0, f"euler {shlex.join(argv)}: exit {code}\n{err}"
        ran.append(argv[0])
    assert sorted(used) == sorted(REWRITES), "a rewrite no longer meets the README's command"
    assert ran == ["train", "data", "data", "train", "sft", "eval", "eval", "chat", "plot"], ran
    assert (work / "runs" / "sft" / "checkpoint.safetensors").is_file()
