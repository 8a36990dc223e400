"""What a run shows on the terminal, and the Ctrl-C it takes from it."""

from __future__ import annotations

import signal

COMPILING = "first step: compiling kernels (first run only"  # its notice, less the estimate
LOADING = "first step: loading the compiled kernels from Numba's cache"
# what a first step's time holds besides the step, cold cache or warm
FIRST_STEP_EXTRA = "kernel compile or cache load included"


def compile_notice(cached: bool, last_seconds: float | None) -> str:
    """What the terminal shows until the first step has run: that kernels load from the
    cache, or that they compile, with the last cold start's time when one was recorded."""
    if cached:
        return LOADING
    about = f", about {last_seconds:.0f} s last time" if last_seconds else ""
    return f"{COMPILING}{about}; later runs load them from the cache)"


def clock(seconds: float) -> str:
    """h:mm:ss."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Display:
    """A rich progress bar on a terminal; plain log lines every log_every steps otherwise.

    Honest about the first step of a process: until it has run, no loss, speed or ETA is
    shown (there is none), only `notice` (compile_notice: Numba compiles on a cold cache,
    which can take longer than many steps); speed and ETA are measured over the steps
    after it."""

    def __init__(self, console, total: int, start: int, log_every: int, notice: str):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.console, self.log_every = console, log_every
        self.progress = None
        if console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[status]}", markup=False),
                console=console,
            )
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               status=notice)  # fmt: skip
            self.progress.start()
        else:
            console.print(notice, markup=False, highlight=False)

    def step(
        self, step: int, total: int, loss: float, lr: float, tps: float | None,
        eta: float | None, first_seconds: float | None = None,
    ) -> None:  # fmt: skip
        """Show finished step `step` of `total`; tps in tokens/s and eta in seconds over the
        steps after this process's first (None until there are some; first_seconds: that
        first step's time, the kernels' compile or cache load included)."""
        status = f"loss {loss:.4f}  lr {lr:.2e}  "
        if tps is None:
            status += f"first step {first_seconds or 0:.1f} s ({FIRST_STEP_EXTRA})"
        else:
            status += f"{tps:,.0f} tok/s  ETA {clock(eta or 0)}"
        if self.progress is not None:
            self.progress.update(self.task, completed=step, status=status)
        elif step % self.log_every == 0 or step == total or tps is None:
            self.console.print(f"step {step}/{total}  {status}", markup=False, highlight=False)

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
