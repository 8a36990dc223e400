"""JSON records of a GPU lab run (bench/labs/*_lab_gpu.py): each printed as one line when made,
and the whole list rewritten to the output file after each, so a run cut short (a device
call's time limit) still leaves what it measured."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import numpy as np

RECORDS: list[dict] = []  # this run's records (a lab is one process)


def emit(path: Path | None, /, **rec) -> None:
    """Print one record as a JSON line and rewrite the output file with every record so far."""
    RECORDS.append(rec)
    print(json.dumps(rec), flush=True)
    if path:
        path.write_text(json.dumps(RECORDS, indent=1))


def last_line() -> str:
    """The exception being handled, as its traceback's last line."""
    return traceback.format_exc().strip().splitlines()[-1]


def guarded(path: Path | None, what: str, fn, **ctx):
    """fn(), or, if it raises, an error record (the exception's last line) and None."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - every failure is a result to report
        emit(path, kind="error", what=what, error=last_line(), **ctx)
        return None


def rel_err(a: np.ndarray, ref: np.ndarray | None) -> float | None:
    """max |a - ref| / max |ref|, or None without a reference."""
    if ref is None:
        return None
    return float(np.max(np.abs(a - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
