"""Engine commands: gradcheck."""

from __future__ import annotations

import typer

from euler.errors import EulerError


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    def gradcheck(
        seed: int = typer.Option(0, help="Seed for weights, inputs and sampled entries."),
        samples: int = typer.Option(12, help="Entries sampled per tensor."),
    ) -> None:
        """Check every analytic gradient against float64 central finite differences."""
        from euler.model.gradcheck import run_gradcheck

        if samples < 1:
            raise EulerError(f"--samples must be at least 1, got {samples}")
        if seed < 0:
            raise EulerError(f"--seed must not be negative, got {seed}")

        ok = run_gradcheck(seed=seed, samples=samples)
        raise typer.Exit(0 if ok else 1)
