"""TensorBoard event files beside metrics.jsonl (`--tensorboard DIR`), through tensorboardX.

Every number a run records (training loss, learning rate, gradient norm, validation losses
per head, speed) becomes a scalar at its step, and each evaluation's text sample a text
entry. Each run (and each resume) adds a new event file to DIR: nothing there is replaced.
"""

from __future__ import annotations

import math
from pathlib import Path

from euler import ownership
from euler.errors import EulerError

EXTRA = "pip install -e '.[tensorboard]'"


def check_event_dir(path: str | Path) -> Path:
    """The folder --tensorboard names, refused in one line where events may not go: a file,
    or a folder of ours (a run, a data folder, an export), whose files have their own rules;
    and without tensorboardX."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EulerError(f"--tensorboard {path}: is a file, not a folder")
    found = ownership.identify(path)
    if found.kind is not None:
        raise EulerError(f"--tensorboard {path}: holds {found.words}; give event files a "
                         "folder of their own (a subfolder of the run, say)")  # fmt: skip
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise EulerError(f"--tensorboard needs tensorboardX: {EXTRA}") from None
    return path


class EventLog:
    """A TensorBoard event file in `folder`, written as the run records its lines."""

    def __init__(self, folder: str | Path):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(check_event_dir(folder)))

    def record(self, obj: dict) -> None:
        """One metrics line: each finite number a scalar at obj['step'] (a list: one scalar
        an entry, `name/i`), the sample text a text entry."""
        step = int(obj["step"])
        for key, value in obj.items():
            if key == "step":
                continue
            if key == "sample" and value:
                self.writer.add_text("sample", str(value), step)
            values = value if isinstance(value, list) else [value]
            for i, v in enumerate(values):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.writer.add_scalar(f"{key}/{i}" if isinstance(value, list) else key,
                                           float(v), step)  # fmt: skip
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
