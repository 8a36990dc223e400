"""Tokenizer commands: `euler tokenizer train`, `encode`, `decode` and `stats`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from euler.cli import json_output
from euler.cli.commands_data import MAX_THREADS, check_int
from euler.cli.json_output import JsonOut

from euler import ownership
from euler.errors import EulerError

tokenizer_app = typer.Typer(
    help="Train, apply and inspect the byte-level BPE tokenizer.", no_args_is_help=True
)

MAX_VOCAB_LISTED = 1 << 20  # --top: more rows than any vocabulary has is a typo

TokenizerOpt = Annotated[
    Path,
    typer.Option(
        "--tokenizer",
        "-t",
        help="Tokenizer JSON written by `train` or by `data prepare-sft`, or a run folder or "
        "checkpoint (an imported model's own tokenizer).",
    ),
]


def _load(path: Path):
    """Our tokenizer or a foreign byte-level BPE, from a tokenizer JSON, or the one a
    checkpoint (a .safetensors file, or a run folder's) carries."""
    from euler.tokenizer import load_any

    from euler.training.checkpoint import CHECKPOINT_NAME, read_tokenizer

    path = Path(path)
    if path.suffix == ".safetensors" or (path.is_dir() and (path / CHECKPOINT_NAME).is_file()):
        return read_tokenizer(path)
    return load_any(path)


def _read(path: Path) -> str:
    """A file's text; undecodable bytes ride along as surrogate escapes (encoded back)."""
    if str(path) == "-":
        return sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        raise EulerError(f"input file not found: {path}") from None
    except OSError as e:
        raise EulerError(f"cannot read {path}: {e.strerror}") from None


@tokenizer_app.command()
def train(
    inputs: Annotated[list[Path], typer.Argument(help="Text files to learn from (UTF-8).")],
    vocab_size: Annotated[
        int, typer.Option(help="Ids in all: 256 bytes + 4 special tokens + merges.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the tokenizer JSON.")],
    hf: Annotated[
        Path | None, typer.Option(help="Also write a Hugging Face tokenizer.json here.")
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
) -> None:
    """Learn a tokenizer from text files (streamed) and save it."""
    from euler.tokenizer import FIRST_MERGE_ID, MAX_VOCAB_SIZE, Tokenizer

    check_int(vocab_size, "--vocab-size", FIRST_MERGE_ID, MAX_VOCAB_SIZE)
    reads = [("input", path) for path in inputs]
    # fail before training, not after (euler.ownership's rule for every output)
    ownership.claim_file(out, ownership.TOKENIZER, overwrite, reads, "--out")
    if hf is not None:
        ownership.claim_file(hf, ownership.HF_TOKENIZER, overwrite, reads, "--hf")
    if hf is not None and hf.resolve() == out.resolve():
        raise EulerError(f"--hf {hf}: the same file as --out")
    t = time.perf_counter()
    tok = Tokenizer.train(inputs, vocab_size, progress=progress)
    elapsed = time.perf_counter() - t
    tok.save(out)
    if hf is not None:
        tok.export_hf(hf)
    typer.echo(f"{out}: vocab {tok.vocab_size} in {elapsed:.1f} s, sha256 {tok.sha256}")


@tokenizer_app.command()
def encode(
    tokenizer: TokenizerOpt,
    input: Annotated[Path, typer.Argument(help="Text file to encode ('-' for stdin).")],
    allow_special: Annotated[
        bool, typer.Option(help="Turn special-token text such as <|user|> into its id.")
    ] = False,
    threads: Annotated[int | None, typer.Option(help="Threads (default: every core).")] = None,
) -> None:
    """Print the token ids of a file, space-separated."""

    if threads is not None:
        check_int(threads, "--threads", 1, MAX_THREADS)
    tok = _load(tokenizer)
    ids = tok.encode_batch([_read(input)], allow_special=allow_special, threads=threads)[0]
    typer.echo(" ".join(map(str, ids.tolist())))


@tokenizer_app.command()
def decode(
    tokenizer: TokenizerOpt,
    ids: Annotated[
        list[str] | None, typer.Argument(help="Token ids (default: read them from stdin).")
    ] = None,
) -> None:
    """Print the text of token ids."""

    tok = _load(tokenizer)
    words = ids if ids else sys.stdin.read().split()
    values = []
    for i, w in enumerate(words):
        if not w.isascii() or not w.isdigit() or int(w) >= tok.vocab_size:
            raise EulerError(
                f"token id {i + 1} ({w[:20]!r}) must be an integer in [0, {tok.vocab_size - 1}]"
            )
        values.append(int(w))
    sys.stdout.write(tok.decode(values))
    sys.stdout.flush()


@tokenizer_app.command()
def stats(
    tokenizer: TokenizerOpt,
    inputs: Annotated[list[Path], typer.Argument(help="Text files to measure.")],
    top: Annotated[int, typer.Option(help="How many of the most frequent tokens to list.")] = 20,
    json_out: JsonOut = None,
) -> None:
    """Bytes per token on each file, and the most frequent tokens over all of them."""
    import numpy as np
    from rich.table import Table

    check_int(top, "--top", 0, MAX_VOCAB_LISTED)
    json_output.claim(json_out, "tokenizer stats", [("input", p) for p in inputs])
    tok = _load(tokenizer)
    files, frequent = [], []
    counts = np.zeros(tok.vocab_size, np.int64)
    table = Table(title=f"tokenizer {tokenizer} (vocab {tok.vocab_size})")
    table.add_column("file", overflow="fold")  # folded at 80 columns, never cut
    for col in ("bytes", "tokens", "bytes/token"):
        table.add_column(col, justify="right", no_wrap=True)
    for path in inputs:
        text = _read(path)
        ids = tok.encode_batch([text])[0]
        n_bytes = len(text.encode("utf-8", "surrogateescape"))
        counts += np.bincount(ids, minlength=tok.vocab_size)
        ratio = n_bytes / max(len(ids), 1)
        table.add_row(str(path), f"{n_bytes:,}", f"{len(ids):,}", f"{ratio:.3f}")
        files.append({"file": str(path), "bytes": n_bytes, "tokens": len(ids),
                      "bytes_per_token": ratio})  # fmt: skip
    freq = Table(title=f"{top} most frequent tokens")
    freq.add_column("id", justify="right", no_wrap=True)
    freq.add_column("token", overflow="fold")
    for col in ("count", "share"):
        freq.add_column(col, justify="right", no_wrap=True)
    total = max(int(counts.sum()), 1)
    for i in np.argsort(-counts, kind="stable")[:top]:
        if counts[i] == 0:
            break
        shown = repr(tok.token_bytes(int(i)).decode("utf-8", "replace"))
        freq.add_row(str(i), shown, f"{counts[i]:,}", f"{counts[i] / total:.2%}")
        frequent.append({"id": int(i), "bytes": tok.token_bytes(int(i)).hex(),
                         "count": int(counts[i]), "share": float(counts[i] / total)})  # fmt: skip
    console = json_output.console(json_out)
    console.print(table)
    console.print(freq)
    doc = {"tokenizer": str(tokenizer), "vocab_size": tok.vocab_size, "files": files,
           "frequent": frequent}  # fmt: skip
    json_output.emit(json_out, "tokenizer stats", doc)


def register(app: typer.Typer) -> None:
    """Add the `tokenizer` command family to the app."""
    app.add_typer(tokenizer_app, name="tokenizer")
