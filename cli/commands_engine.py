"""Engine commands: gradcheck."""

from __future__ import annotations

import typer
from euler.cli.options import threads_option

from euler.errors import EulerError

GradcheckThreads = threads_option("1: its tensors are tiny, a parallel region costs more")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    def gradcheck(
        seed: int = typer.Option(0, help="Seed for weights, inputs and sampled entries."),
        samples: int = typer.Option(12, help="Entries sampled per tensor."),
        threads: GradcheckThreads = None,
    ) -> None:
        """Check every analytic gradient against float64 central finite differences."""
        from euler.model.gradcheck import run_gradcheck

        if samples < 1:
            raise EulerError(f"--samples must be at least 1, got {samples}")
        if seed < 0:
            raise EulerError(f"--seed must not be negative, got {seed}")

        from euler.threads import pick_threads

        ok = run_gradcheck(seed=seed, samples=samples,
                           threads=pick_threads(threads) if threads is not None else 1)  # fmt: skip
        raise typer.Exit(0 if ok else 1)
