"""One name for one thing: every command's options, read from the click tree that `--help`
prints, spell each concept as the README's table does; old spellings are hidden, say what
replaced them, and still work with one note on stderr."""

from __future__ import annotations

import pytest

from tests.train_helpers import run_cli

# concept flag -> the synonyms no command may show (what other projects, or we, once used)
SYNONYMS = {
    "--checkpoint": ("--from", "--ckpt", "--model", "--init-from", "--run", "--model-path"),
    "--batch-size": ("--batch", "--bs", "--micro-batch", "--batch-sz"),
    "--seq-len": ("--seq", "--seq-length", "--sequence-length", "--block-size"),
    "--warmup-steps": ("--warmup", "--warmup-iters", "--lr-warmup"),
    "--untimed-steps": ("--warmup-iterations", "--untimed"),
    "--max-tokens": ("--max-new-tokens", "--num-tokens", "--n-tokens", "--length"),
    "--out": ("--output", "--out-dir", "--output-dir"),
    "--json": ("--json-out", "--report", "--json-path"),
}
# concept flag -> words its help must hold: the one meaning it has on every command
MEANING = {
    "--batch-size": "B:",
    "--seq-len": "T:",
    "--context": "context",
    "--warmup-steps": "warmup",
    "--untimed-steps": "Untimed",
}
CONTEXT_COMMANDS = {"train", "import"}  # --context: the model's context, set where it is built
# hidden old spellings, and the flag each now is
OLD = {"--batch": "--batch-size", "--seq": "--seq-len", "--warmup": ("--warmup-steps",
       "--untimed-steps"), "--from": "--checkpoint", "--context": "--seq-len"}  # fmt: skip


def _commands():
    """(command path, click command) of every leaf command of `euler`."""
    import typer.main
    from euler.cli import main

    main._register_families()
    stack = [((), typer.main.get_command(main.app))]
    while stack:
        path, cmd = stack.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            stack += [((*path, name), sub) for name, sub in subs.items()]
        else:
            yield " ".join(path), cmd


def _options(cmd, hidden: bool):
    """(flag, help) of each option spelling of a command, hidden ones or shown ones."""
    for p in cmd.params:
        if getattr(p, "param_type_name", "") != "option" or bool(p.hidden) != hidden:
            continue
        for flag in (*p.opts, *p.secondary_opts):
            if flag.startswith("--"):
                yield flag, p.help or ""


COMMANDS = dict(_commands())


def test_the_tree_holds_every_family():
    """The walk reaches nested commands (else every check below passes vacuously)."""
    for name in ("train", "sft", "bench", "eval", "plot", "data prepare-sft", "kernels list"):
        assert name in COMMANDS, sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_command_shows_a_synonym(name):
    synonyms = {s: flag for flag, words in SYNONYMS.items() for s in words}
    for flag, _ in _options(COMMANDS[name], hidden=False):
        assert flag not in synonyms, f"euler {name} {flag}: spell it {synonyms[flag]}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_concept_flag_has_its_one_meaning(name):
    for flag, helptext in _options(COMMANDS[name], hidden=False):
        if flag in MEANING:
            assert MEANING[flag] in helptext, f"euler {name} {flag}: {helptext!r}"
        if flag == "--context":
            assert name in CONTEXT_COMMANDS, f"euler {name} --context: use --seq-len for T"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_checkpoint_or_run_by_position(name):
    """The model a command reads is --checkpoint on every command, never an argument."""
    for p in COMMANDS[name].params:
        if getattr(p, "param_type_name", "") == "argument" and not p.hidden:
            assert p.name not in ("checkpoint", "run", "runs", "ckpt"), f"euler {name} {p.name}"


def _help_flags(text: str) -> set[str]:
    """The long flags of the options panels of a command's printed --help (Rich's boxes: a
    row opens with the flags, `*` marking a required one, before the `<type>` column)."""
    flags = set()
    for line in text.splitlines():
        cell = line.removeprefix("│")
        row = cell.strip().removeprefix("*").strip()
        # a help text's continuation line starts far to the right, in the help column
        if line.startswith("│") and row.startswith("--") and cell.index("-") < 8:
            flags |= {w for w in row.split("<")[0].split() if w.startswith("--")}
    return flags


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_printed_help_shows_exactly_the_options_and_no_synonym(name, monkeypatch, capsys):
    """What `euler NAME --help` prints, parsed: every shown option of the tree and no other
    flag (so the checks above are the text a user reads), and no synonym of a concept."""
    monkeypatch.setenv("COLUMNS", "200")  # one row an option, its flags whole
    code, out, err = run_cli(monkeypatch, capsys, *name.split(), "--help")
    assert code == 0, err
    shown = _help_flags(out)
    assert shown == {"--help", *(flag for flag, _ in _options(COMMANDS[name], hidden=False))}, out
    synonyms = {s for words in SYNONYMS.values() for s in words}
    assert not shown & synonyms, f"euler {name} --help shows {shown & synonyms}"


def test_hidden_options_are_old_spellings_that_name_the_new_one():
    seen = set()
    for name, cmd in COMMANDS.items():
        for flag, helptext in _options(cmd, hidden=True):
            assert flag in OLD, f"euler {name} hides {flag}: not a known old spelling"
            new = OLD[flag] if isinstance(OLD[flag], tuple) else (OLD[flag],)
            assert any(helptext == f"Deprecated: {n}." for n in new), (name, flag, helptext)
            shown = {f for f, _ in _options(cmd, hidden=False)}
            assert shown & set(new), f"euler {name} {flag}: its new name is missing"
            seen.add(flag)
    assert seen == set(OLD)


@pytest.mark.parametrize(
    "args, new, then",
    [
        (("bench", "--batch", "0"), "--batch-size", "--batch-size must be at least 1"),
        (("bench", "--preset", "tiny", "--seq", "999"), "--seq-len", "--seq-len 999 exceeds"),
        (("bench", "--warmup", "-1"), "--untimed-steps", "--untimed-steps must be 0 or more"),
        (("train", "--warmup", "-1"), "--warmup-steps", "--warmup-steps must be an integer"),
        (("sft", "--from", "{tmp}/nothing", "--data", "{tmp}"), "--checkpoint", "not found"),
        (
            (
                "data",
                "prepare-sft",
                "a.json",
                "--tokenizer",
                "t",
                "--out",
                "{tmp}/o",
                "--context",
                "1",
            ),
            "--seq-len",
            "--seq-len must be an integer",
        ),  # fmt: skip
        (("eval", "{tmp}/ck"), "--checkpoint CHECKPOINT", "give --text"),
        (("plot", "{tmp}/run"), "--checkpoint RUN", "no metrics to plot"),
    ],
    ids=["batch", "seq", "bench-warmup", "train-warmup", "from", "context", "eval", "plot"],
)
def test_old_spellings_still_work_with_a_note(args, new, then, tmp_path, monkeypatch, capsys):
    """The old spelling reaches the same check as the new one (its value is used), after
    one note on stderr that names the new flag."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0].startswith("note: ") and f"use {new}" in lines[0], err
    assert then in lines[1], err


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "--batch", "2", "--batch-size", "4"),
        ("sft", "--from", "a", "--checkpoint", "b", "--data", "d"),
        ("eval", "a", "--checkpoint", "b", "--text", "t"),
    ],  # fmt: skip
    ids=["bench", "sft", "eval"],
)
def test_both_spellings_are_refused(args, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "give only" in err or "(only)" in err, err
