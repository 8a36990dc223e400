"""The `euler` command: one typer app; each command family lives in its own module."""

from __future__ import annotations

import functools
import sys
import typing
import warnings

import typer
from euler.cli.json_output import JsonOut

from euler.errors import EulerError

app = typer.Typer(
    help="NanoEuler: train, check, benchmark and chat with a small language model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    """--version: the package's version, then exit (before any command runs)."""
    if value:
        from euler import __version__

        print(f"euler (nanoeuler) {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """NanoEuler: train, check, benchmark and chat with a small language model."""


@app.command()
def info(
    preset: str = typer.Option("small", help="Preset name: tiny, small or gpu."),
    json_out: JsonOut = None,
) -> None:
    """Print a preset's configuration and its exact parameter count."""
    from euler.cli import json_output
    from rich.table import Table

    from euler.model.config import get_preset
    from euler.model.params import param_table

    json_output.claim(json_out, "info")
    cfg = get_preset(preset)
    table = Table(title=f"preset {preset}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for k, v in cfg.to_dict().items():
        table.add_row(k, str(v))
    table.add_row("head_size (E)", str(cfg.head_size))
    table.add_row("tensors", str(len(param_table(cfg))))
    console = json_output.console(json_out)
    console.print(table)
    console.print(f"parameters: {cfg.n_params():,}")
    json_output.emit(json_out, "info", {"preset": preset, "config": cfg.to_dict(),
                                        "head_size": cfg.head_size,
                                        "tensors": len(param_table(cfg)),
                                        "parameters": cfg.n_params()})  # fmt: skip


@functools.cache
def _register_families() -> None:
    """Attach the command families that live in their own modules (once: main() may run
    many times in one process, as in the tests)."""
    from euler.cli import commands_data, commands_engine

    commands_engine.register(app)
    commands_data.register(app)
    from euler.cli import commands_tokenizer

    commands_tokenizer.register(app)
    from euler.cli import commands_train

    commands_train.register(app)
    from euler.cli import commands_interop

    commands_interop.register(app)
    from euler.cli import commands_bench, commands_eval

    commands_bench.register(app)
    commands_eval.register(app)
    from euler.cli import commands_serve

    commands_serve.register(app)
    from euler.cli import commands_sample

    commands_sample.register(app)
    from euler.cli import commands_kernels

    commands_kernels.register(app)
    from euler.cli import commands_pipeline

    commands_pipeline.register(app)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, without the source line Python shows beside it."""
    print(f"warning: {message}", file=sys.stderr)


def main() -> None:
    """Console-script entry point: run the app; a bad flag, file or disk is one line on
    stderr and exit status 2 (no traceback); a warning is one line too."""
    warnings.showwarning = _one_line_warning
    _register_families()
    try:
        # outside standalone mode click returns a command's typer.Exit code instead of exiting
        code = app(standalone_mode=False)
    except EulerError as e:
        _refuse(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:  # a full disk, a permission, a folder where a file belongs
        where = f"{e.filename}: " if e.filename else ""
        _refuse(f"{where}{e.strerror or e}")
    except MemoryError:
        _refuse("out of memory")
    except Exception as e:
        # click's usage errors arrive here outside standalone mode; typer may vendor click,
        # so they are recognised by what they offer, not by class
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()
            sys.exit(e.exit_code)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            _refuse(e.format_message(), e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(1)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(message: str, code: int = 2) -> typing.NoReturn:
    """Print `error: MESSAGE` as one line on stderr and exit."""
    print("error: " + " ".join(message.split()), file=sys.stderr)
    sys.exit(code)
