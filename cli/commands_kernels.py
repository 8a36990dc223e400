"""Kernel commands: `euler kernels list`, `show` and `write`: the GPU attention sources as text.

No GPU is needed: the generators are plain Python (euler/gpu/kernel_sources.py). fp32's
kernels are not generated: `show --precision fp32` prints their plain file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from euler.cli import json_output
from euler.cli.json_output import JsonOut

from euler.errors import EulerError

kernels_app = typer.Typer(
    help="Print the GPU attention kernels (the source the GPU compiles), no GPU needed.",
    no_args_is_help=True,
)

LAYERS = ("attention",)  # the layers whose kernels are generated; the others are plain files


def _modules(layer: str, precision: str, head_size: int) -> dict[str, str]:
    """The generated modules of one layer, precision and head size, or a one-line refusal."""
    from euler.gpu import kernel_sources

    if layer not in LAYERS:
        raise EulerError(
            f"layer: one of {', '.join(LAYERS)} (the other layers' kernels are plain files "
            f"in euler/gpu/), not {layer!r}"
        )
    if precision not in kernel_sources.PRECISIONS:
        raise EulerError(
            f"--precision: one of {', '.join(kernel_sources.PRECISIONS)}, not {precision!r}"
        )
    if precision not in kernel_sources.GENERATED:
        return {}
    sizes = kernel_sources.head_sizes(precision)
    if head_size not in sizes:
        raise EulerError(
            f"--head-size: one of {', '.join(map(str, sizes))} at {precision}, not {head_size}"
        )
    return kernel_sources.attention_modules(precision, head_size)


@kernels_app.command("list")
def list_(json_out: JsonOut = None) -> None:
    """List every attention kernel: precision, head size, kernel, lines, file name."""
    from rich import box
    from rich.table import Table

    json_output.claim(json_out, "kernels list")
    table = Table(title="GPU attention kernels", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False)  # fmt: skip
    for col in ("layer", "precision", "E", "kernel", "lines"):
        table.add_column(col, justify="right" if col in ("E", "lines") else "left")
    table.add_column("file", overflow="fold")
    rows = []
    for row in kernel_rows():
        rows.append(row)
        E = "any" if row["head_size"] is None else str(row["head_size"])
        file = row["file"] + ("" if row["generated"] else " (not generated)")
        table.add_row(row["layer"], row["precision"], E, row["kernel"], str(row["lines"]), file)
    json_output.console(json_out).print(table)
    json_output.emit(json_out, "kernels list", {"kernels": rows})


def kernel_rows() -> list[dict]:
    """Every attention kernel: layer, precision, head size (None: any), kernel, lines, file
    and whether it is generated."""
    from euler.gpu import kernel_sources

    path, text = kernel_sources.readable_source()
    rows = [{"layer": "attention", "precision": "fp32", "head_size": None, "kernel": "both",
             "lines": text.count("\n"), "file": str(path), "generated": False}]  # fmt: skip
    for precision in kernel_sources.GENERATED:
        for E in kernel_sources.head_sizes(precision):
            for kernel, text in kernel_sources.attention_modules(precision, E).items():
                name = kernel_sources.file_name(precision, E, kernel)
                rows.append({"layer": "attention", "precision": precision, "head_size": E,
                             "kernel": kernel, "lines": text.count("\n"), "file": name,
                             "generated": True})  # fmt: skip
    return rows


@kernels_app.command()
def show(
    layer: Annotated[str, typer.Argument(help="The layer: attention.")],
    precision: Annotated[
        str,
        typer.Option(
            help="fp32 (the readable exact kernels, --exact-attention: their plain file, any "
            "head size), tf32 (tensor cores, the default) or bf16."
        ),
    ] = "tf32",
    head_size: Annotated[int, typer.Option(help="Head size E.")] = 64,
    kernel: Annotated[str, typer.Option(help="forward, backward or both.")] = "both",
) -> None:
    """Print the source of a layer's kernels, exactly as the GPU compiles it (fp32: the whole
    plain file, whose forward and backward kernels serve every head size)."""
    from euler.gpu import kernel_sources

    modules = _modules(layer, precision, head_size)
    if kernel not in ("forward", "backward", "both"):
        raise EulerError(f"--kernel: forward, backward or both, not {kernel!r}")
    if not modules:
        print(kernel_sources.readable_source()[1], end="")
        return
    names = ("forward", "backward") if kernel == "both" else (kernel,)
    for i, name in enumerate(names):
        if i:
            print()
        print(modules[name], end="")


@kernels_app.command()
def write(
    folder: Annotated[Path, typer.Argument(help="Where to write them (docs/kernels).")],
) -> None:
    """Write every generated kernel to FOLDER, one file each (as docs/kernels/ holds them).

    A file already there is replaced only if it is a generated kernel itself (its first
    line says so); any other is refused before anything is written. Each file is written
    to a temporary name and renamed."""
    from euler.gpu import kernel_sources
    from euler.training.checkpoint import write_atomic

    if folder.exists() and not folder.is_dir():
        raise EulerError(f"FOLDER {folder}: is a file, not a folder")
    modules = kernel_sources.all_attention_modules()
    marker = next(iter(modules.values())).splitlines()[0]
    for name in modules:
        path = folder / name
        if path.exists() and (not path.is_file() or _first_line(path) != marker):
            raise EulerError(
                f"FOLDER {folder}: {name} exists and is not a generated kernel; "
                "kernels write never replaces it: choose another folder"
            )
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in modules.items():
        write_atomic(folder / name, text.encode("utf-8"), what=name)
    stale = sorted(p.name for p in folder.glob("attention_*.py") if p.name not in modules)
    print(f"{len(modules)} files in {folder}")
    if stale:
        print("no longer generated (remove them): " + ", ".join(stale))


def _first_line(path: Path) -> str:
    """A file's first line, or '' if it cannot be read as text."""
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return ""


def register(app: typer.Typer) -> None:
    """Add the `kernels` command family to the app."""
    app.add_typer(kernels_app, name="kernels")
