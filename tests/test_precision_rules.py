"""The precision rules, stated once (euler.precision.ACCEPTED), and every command's
--precision refusal and help worded from them: no command suggests a precision that it
refuses on the same device, and commands agree on what a device can do."""

from __future__ import annotations

import itertools
import re

import pytest

from euler.errors import EulerError
from euler.precision import (
    ACCEPTED,
    DEVICES,
    PRECISIONS,
    precision_error,
    precision_help,
    resolve_precision,
)
from tests.train_helpers import run_cli

COMBOS = list(itertools.product(ACCEPTED, DEVICES, PRECISIONS))


def _named(text: str) -> set[str]:
    return set(re.findall(r"\b(fp32|tf32|bf16)\b", text))


@pytest.mark.parametrize("command,device,precision", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_a_precision_is_accepted_exactly_where_the_table_says(command, device, precision):
    takes = ACCEPTED[command][device]
    if precision in takes:
        assert resolve_precision(device, precision, command) == precision
        return
    with pytest.raises(EulerError) as e:
        resolve_precision(device, precision, command)
    line = str(e.value)
    assert line == str(precision_error(command, device, precision))
    assert line.startswith(f"--precision {precision}: euler {command} --device {device} ")
    # what it says the command takes there is exactly the table's row
    offered = line.split(" takes ", 1)[1].split(" (", 1)[0]
    assert _named(offered) == set(takes), line
    # it sends the user to another device only where the same command runs this precision
    if "runs with --device" in line:
        other = line.rsplit("--device ", 1)[1]
        assert precision in ACCEPTED[command][other], line
    else:
        assert not any(precision in ACCEPTED[command][d] for d in DEVICES if d != device)


def test_the_default_is_the_first_accepted_and_the_documented_one():
    for command, rows in ACCEPTED.items():
        for device, takes in rows.items():
            assert resolve_precision(device, None, command) == takes[0]
    # training and decoding agree on the defaults: tf32 on cuda (where taken), fp32 on cpu
    assert {rows["cpu"][0] for rows in ACCEPTED.values()} == {"fp32"}


def test_commands_agree_on_what_a_device_cannot_do():
    # no command takes tf32 on the CPU; every precision a decoder takes, training takes too
    assert all("tf32" not in rows["cpu"] for rows in ACCEPTED.values())
    for decoder, trainer in itertools.product(("chat", "eval", "serve"), ("train", "sft")):
        for device in DEVICES:
            assert set(ACCEPTED[decoder][device]) <= set(ACCEPTED[trainer][device])


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(EulerError, match="--precision: 'fp16' is not one of fp32, tf32, bf16"):
        resolve_precision("cpu", "fp16", "chat")


# each command's arguments up to its --precision check (no file is read before it)
ARGS = {
    "train": ("train", "--steps", "1", "--out", "{tmp}/run"),
    "sft": (
        "sft",
        "--checkpoint",
        "{tmp}/none.safetensors",
        "--data",
        "{tmp}/d",
        "--out",
        "{tmp}/r",
    ),
    "bench": ("bench", "--no-peer"),
    "chat": ("chat", "--checkpoint", "{tmp}/none.safetensors", "--prompt", "hi"),
    "eval": ("eval", "--checkpoint", "{tmp}/none.safetensors", "--text", "{tmp}/none.txt"),
    "serve": ("serve", "--checkpoint", "{tmp}/none.safetensors"),
}
REFUSED = [
    (c, d, p)
    for c, d, p in COMBOS
    if p not in ACCEPTED[c][d] and (d == "cpu" or c == "serve")  # no GPU needed to refuse
]


@pytest.mark.parametrize("command,device,precision", REFUSED, ids=["-".join(c) for c in REFUSED])
def test_every_command_refuses_in_the_tables_words(
    command, device, precision, tmp_path, monkeypatch, capsys
):
    args = [a.format(tmp=tmp_path) for a in ARGS[command]]
    code, out, err = run_cli(
        monkeypatch, capsys, *args, "--device", device, "--precision", precision
    )
    assert "Traceback" not in out + err
    assert code == 2, err
    assert err.strip() == f"error: {precision_error(command, device, precision)}"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_every_commands_help_is_the_tables():
    import typer
    from euler.cli.main import _register_families, app

    _register_families()
    group = typer.main.get_command(app)
    for command in ACCEPTED:
        (option,) = [p for p in group.commands[command].params if p.name == "precision"]
        assert precision_help(command) in option.help, command


def test_the_readme_states_the_same_table():
    from pathlib import Path

    from euler.precision import accepted_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert accepted_table() in readme
