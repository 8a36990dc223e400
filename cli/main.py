"""The `euler` command: one typer app; each command family lives in its own module."""

from __future__ import annotations

import sys

import typer

from euler.errors import EulerError

app = typer.Typer(
    help="NanoEuler: train, check, benchmark and chat with a small language model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def info(preset: str = typer.Option("small", help="Preset name: tiny, small or gpu.")) -> None:
    """Print a preset's configuration and its exact parameter count."""
    from rich.console import Console
    from rich.table import Table

    from euler.config import get_preset
    from euler.params import param_table

    cfg = get_preset(preset)
    table = Table(title=f"preset {preset}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for k, v in cfg.to_dict().items():
        table.add_row(k, str(v))
    table.add_row("head_size (E)", str(cfg.head_size))
    table.add_row("tensors", str(len(param_table(cfg))))
    console = Console()
    console.print(table)
    console.print(f"parameters: {cfg.n_params():,}")


def _register_families() -> None:
    """Attach the command families that live in their own modules."""
    from euler.cli import commands_data, commands_engine

    commands_engine.register(app)
    commands_data.register(app)
    from euler.cli import commands_tokenizer

    commands_tokenizer.register(app)
    from euler.cli import commands_train

    commands_train.register(app)
    from euler.cli import commands_interop

    commands_interop.register(app)


def main() -> None:
    """Console-script entry point: run the app, turning EulerError into one line on stderr."""
    _register_families()
    try:
        app(standalone_mode=False)
    except EulerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        raise
