"""`euler pipeline`: from the shared raw data to a pretrained and fine-tuned model and its
report.md in one command (the stages and the folder rules: euler/pipeline.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from euler.errors import EulerError
from euler.schema import check_number

MAX_MINUTES = 60 * 24 * 365


def register(app: typer.Typer) -> None:
    """Add the pipeline command to the app."""

    @app.command("pipeline")
    def pipeline_command(
        device: Annotated[str, typer.Option(help="cpu, or cuda (needs the gpu extra).")] = "cpu",
        minutes: Annotated[
            float | None,
            typer.Option(
                help="Time budget: after data preparation, 70% of what is left pretrains, "
                "15% fine-tunes, 15% evaluates and plots (tokens, steps and the held-out "
                "tokens scored fitted to the training speed measured first). Default: the "
                "README's 10M tokens, 300 steps, the whole held-out split."
            ),
        ] = None,
        out: Annotated[
            Path, typer.Option("--out", "-o", help="Folder of the data, runs and report.md.")
        ] = Path("pipeline"),
        data_root: Annotated[
            Path,
            typer.Option(help="The shared raw data: books/, web/ and instructions/*.json."),
        ] = Path("../shared/data"),
        preset: Annotated[str, typer.Option(help="Model preset: tiny, small or gpu.")] = "small",
        vocab_size: Annotated[int, typer.Option(help="Size of the tokenizer trained.")] = 512,
        batch_size: Annotated[int, typer.Option(help="B: pretraining sequences a step.")] = 16,
        tokens: Annotated[
            int, typer.Option(help="Pretraining tokens (0: the budget's, or 10M).")
        ] = 0,
        sft_steps: Annotated[int, typer.Option(help="SFT steps (0: the budget's, or 300).")] = 0,
        limit: Annotated[
            int, typer.Option(help="Answer only the first N held-out instructions (0: all).")
        ] = 0,
        overwrite: Annotated[
            bool, typer.Option(help="Replace an earlier pipeline's --out folder (only that).")
        ] = False,
    ) -> None:
        """Raw data to a pretrained and fine-tuned model, scored, with OUT/report.md."""
        from euler.cli.commands_data import check_int
        from euler.cli.main import app as euler_app

        from euler.model.config import get_preset
        from euler.pipeline import Settings, run

        if device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {device!r}")
        if minutes is not None:
            check_number(minutes, "--minutes", 0.0, MAX_MINUTES, lo_open=True)
        get_preset(preset)  # an unknown preset is refused before any work
        check_int(batch_size, "--batch-size", 1, 1 << 20)
        check_int(tokens, "--tokens", 0, 1 << 50)
        check_int(sft_steps, "--sft-steps", 0, 1 << 40)
        check_int(limit, "--limit", 0, 1 << 40)

        def run_command(argv: list[str]) -> None:
            # the same app in this process: a failure is the command's own EulerError
            code = euler_app(args=argv, prog_name="euler", standalone_mode=False)
            if isinstance(code, int) and code != 0:
                raise EulerError(f"`euler {' '.join(argv[:2])} ...` exited with status {code}")

        settings = Settings(
            out,
            data_root,
            device,
            preset,
            vocab_size,
            batch_size,
            tokens or None,
            sft_steps or None,
            limit,
            minutes,
            overwrite,
        )
        doc = run(settings, run_command, say=lambda line: print(line, flush=True))
        print(f"wrote {out / 'report.md'} ({doc['total_seconds'] / 60:.1f} minutes)")
