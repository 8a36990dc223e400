"""`--json PATH` on every command that prints a table: the table's numbers as JSON.

PATH `-` writes the JSON alone to stdout and sends the tables and progress to stderr, so
`euler ... --json - | jq` works; a file is written atomically, and replaced only when it is
a report of the same command (euler.ownership.report_kind), as a plot is: running the
command again is how its report is updated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

STDOUT = "-"

JsonOut = Annotated[
    Path | None,
    typer.Option(
        "--json",
        help="Also write the table's numbers as JSON to this file; '-': to stdout alone "
        "(the table then goes to stderr).",
        show_default=False,
    ),
]


def to_stdout(json_out: Path | None) -> bool:
    """Whether --json asks for stdout."""
    return json_out is not None and str(json_out) == STDOUT


def claim(json_out: Path | None, command: str, reads=()) -> None:
    """Refuse a --json file that `euler COMMAND` may not write (before any work)."""
    from euler import ownership

    if json_out is None or to_stdout(json_out):
        return
    ownership.claim_file(json_out, ownership.report_kind(command), True, reads, "--json")


def console(json_out: Path | None):
    """The Rich console for the human output: stderr when the JSON takes stdout."""
    from rich.console import Console

    return Console(stderr=to_stdout(json_out))


def emit(json_out: Path | None, command: str, doc: dict[str, Any]) -> None:
    """Write {"report": "euler COMMAND", **doc} where --json says (nothing without it)."""
    if json_out is None:
        return
    report = {"report": f"euler {command}", **doc}
    if to_stdout(json_out):
        sys.stdout.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    from euler.data.files import write_json_atomic

    write_json_atomic(json_out, report)
    print(f"wrote {json_out}")
