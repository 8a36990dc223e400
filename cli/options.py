"""Options shared by several commands, with one name and one meaning each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from euler.errors import EulerError


def threads_option(default: str) -> Any:
    """`--threads N`: the CPU threads a command computes on; `default` says what it takes
    without the flag, and why."""
    return Annotated[
        int | None,
        typer.Option(
            "--threads", help=f"CPU threads to compute on (default {default}).", show_default=False
        ),
    ]


Threads = threads_option("the cores this process may use")
DecodeThreads = threads_option(
    "1: a token's kernels take microseconds, less than waking other cores costs"
)


CHECKPOINT_HELP = "Checkpoint file, or a run folder holding one."
Checkpoint = Annotated[Path, typer.Option(help=CHECKPOINT_HELP)]  # required where it is used


# Old spellings (README, "One name for one thing"): each still works until REMOVED_IN, as a
# hidden option that prints one line on stderr naming the new flag.
REMOVED_IN = "0.2"


def deprecated(old: str, new: str) -> Any:
    """A hidden typer option for the old spelling `old` of flag `new` (default None)."""
    return typer.Option(old, hidden=True, show_default=False, help=f"Deprecated: {new}.")


# a command that took a value by position: its context keeps extra arguments in ctx.args
OLD_POSITIONAL = {"allow_extra_args": True}


def positional(args: list[str], new_value: Any, new: str) -> list[Path]:
    """The paths once given by position (ctx.args of a command with OLD_POSITIONAL), with
    the note; refused when `new` was given too."""
    if new_value:
        raise EulerError(f"unexpected argument {args[0]!r}: give it as {new} (only)")
    note_renamed(f"{new.split()[-1]} given by position", new)
    return [Path(a) for a in args]


def renamed(old_value: Any, new_value: Any, old: str, new: str, default: Any = None) -> Any:
    """The value of a renamed flag: `new_value`, or the old spelling's when that was given
    (one note on stderr); both given is refused, naming them."""
    if old_value is None or old_value == []:
        return new_value
    if new_value != default:
        raise EulerError(f"{old} is the old spelling of {new}: give only {new}")
    note_renamed(old, new)
    return old_value


def note_renamed(old: str, new: str) -> None:
    """The one line on stderr that an old spelling prints."""
    print(f"note: {old} is deprecated and goes in {REMOVED_IN}: use {new}", file=sys.stderr)
