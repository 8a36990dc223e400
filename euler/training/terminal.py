"""What a run shows on the terminal, and the Ctrl-C it takes from it."""

from __future__ import annotations

import signal


class Display:
    """A rich progress bar on a terminal; plain log lines every log_every steps otherwise."""

    def __init__(self, console, total: int, start: int, log_every: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.console, self.log_every = console, log_every
        self.progress = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}"),
                TextColumn("{task.fields[tps]:,.0f} tok/s"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            )
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               loss=float("nan"), lr=0.0, tps=0.0)  # fmt: skip
            self.progress.start()

    def step(self, step: int, total: int, loss: float, lr: float, tps: float, eta: float) -> None:
        """Show finished step `step` of `total`; tps in tokens/s, eta in seconds."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=loss, lr=lr, tps=tps)
        elif step % self.log_every == 0 or step == total:
            self.console.print(
                f"step {step}/{total}  loss {loss:.4f}  lr {lr:.2e}  {tps:,.0f} tok/s  "
                f"ETA {eta / 60:.1f} min"
            )

    def print(self, text: str) -> None:
        """A line of plain text (no rich markup), above the progress bar."""
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        """Stop the progress bar, leaving its last state on the terminal."""
        if self.progress is not None:
            self.progress.stop()


class StopRequest:
    """SIGINT handler for the loop: the first Ctrl-C asks to stop after the current step."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C: stop now, the last checkpoint stays
                raise KeyboardInterrupt
            self.requested = True

        try:
            self._old = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: Ctrl-C cannot reach us anyway
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
