"""Options shared by several commands, with one name and one meaning each."""

from __future__ import annotations

from typing import Annotated, Any

import typer


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
