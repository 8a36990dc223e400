"""Options shared by several commands, with one name and one meaning each."""

from __future__ import annotations

from typing import Annotated

import typer

Threads = Annotated[
    int | None,
    typer.Option(
        help="CPU threads to compute on (default: the cores this process may use).",
        show_default=False,
    ),
]
DecodeThreads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="CPU threads to decode on (default 1: a token's kernels take microseconds, "
        "less than waking other cores costs).",
        show_default=False,
    ),
]
