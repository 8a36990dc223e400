"""`euler bench`: our engine against the PyTorch peer; the measuring lives in euler.bench.steps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from euler.cli import json_output
from euler.cli.options import Threads, deprecated, renamed

from euler.precision import precision_help


def check_json_out(path: Path | None, overwrite: bool, kind=None, reads=()) -> None:
    """Refuse a --json file the command may not write (euler.ownership's rule: a missing
    folder, a folder, an input, a file of another kind; one of this kind without
    --overwrite), before any work. kind: a bench report unless given."""
    from euler import ownership

    if path is None:
        return
    ownership.claim_file(path, kind or ownership.BENCH_REPORT, overwrite, reads, "--json")


def register(app: typer.Typer) -> None:
    """Add the bench command to the app."""

    @app.command()
    def bench(
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        preset: Annotated[str, typer.Option(help="Model preset: tiny, small or gpu.")] = "small",
        precision: Annotated[
            str | None,
            typer.Option(
                help=f"For both engines (the peer's bf16 is torch.autocast): "
                f"{precision_help('bench')}"
            ),
        ] = None,
        batch_size: Annotated[
            int | None, typer.Option(help="B: sequences per step (default per preset).")
        ] = None,
        seq_len: Annotated[
            int | None, typer.Option(help="T: tokens per sequence (default per preset).")
        ] = None,
        steps: Annotated[int, typer.Option(help="Timed training steps per engine.")] = 5,
        untimed_steps: Annotated[
            int, typer.Option(help="Untimed steps after the first (compiling) one, before them.")
        ] = 1,
        peer: Annotated[
            bool, typer.Option(help="Time the PyTorch peer too (when torch is importable).")
        ] = True,
        compile: Annotated[
            bool, typer.Option(help="Also time torch.compile(peer); compiling takes ~1 min.")
        ] = True,
        peak: Annotated[
            float | None,
            typer.Option(help="Peak TFLOP/s for MFU; default: a matmul measured now."),
        ] = None,
        json_out: Annotated[
            Path | None,
            typer.Option(
                "--json",
                help="Also write every figure as JSON to this file; '-': to stdout alone (the "
                "tables then go to stderr).",
                show_default=False,
            ),
        ] = None,
        overwrite: Annotated[bool, typer.Option(help="Replace an existing --json file.")] = False,
        threads: Threads = None,
        batch_old: Annotated[int | None, deprecated("--batch", "--batch-size")] = None,
        seq_old: Annotated[int | None, deprecated("--seq", "--seq-len")] = None,
        warmup_old: Annotated[int | None, deprecated("--warmup", "--untimed-steps")] = None,
    ) -> None:
        """Time training steps, layers, attention and the tokenizer against PyTorch (given
        as many threads as ours)."""

        from euler.bench.report import print_report
        from euler.bench.steps import BenchOptions, run_bench
        from euler.threads import use_threads

        opts = BenchOptions(
            device=device,
            preset=preset,
            batch=renamed(batch_old, batch_size, "--batch", "--batch-size"),
            seq=renamed(seq_old, seq_len, "--seq", "--seq-len"),
            steps=steps,
            warmup=renamed(warmup_old, untimed_steps, "--warmup", "--untimed-steps", 1),
            peer=peer,
            compile=compile,
            peak_tflops=peak,
            precision=precision,
        )
        opts.resolve()  # flag errors before any output
        use_threads(threads)
        if not json_output.to_stdout(json_out):
            check_json_out(json_out, overwrite)
        console = json_output.console(json_out)
        if not console.is_terminal:
            console.width = max(console.width, 140)  # piped output: keep the tables unwrapped
        result = run_bench(opts, log=lambda line: console.print(f"[dim]{line}[/dim]"))
        print_report(result, console)
        json_output.emit(json_out, "bench", result.to_dict())
