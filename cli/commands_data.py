"""Data commands: `euler data prepare`, `prepare-sft`, `download`, `info` and `verify`.

Every number is checked where it enters, by the flag's name, before any work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from euler.cli import json_output
from euler.cli.json_output import JsonOut
from euler.cli.options import deprecated, renamed

from euler.errors import EulerError
from euler.schema import check_number

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

data_app = typer.Typer(
    help="Prepare token shards from books, web text and instructions.", no_args_is_help=True
)
MAX_THREADS = 4096
MAX_SEED = 2**64 - 1  # the split rule hashes the seed as 8 bytes

Overwrite = Annotated[
    bool, typer.Option(help="Replace an earlier preparation in --out (never one of its inputs).")
]


def check_int(value: int, flag: str, lo: int, hi: int) -> int:
    """An integer flag in [lo, hi], compared as an integer (a huge one overflows a float)."""
    if not lo <= value <= hi:
        raise EulerError(f"{flag} must be an integer in [{lo}, {hi}], got {value}")
    return value


def check_fraction(value: float, flag: str) -> float:
    """A flag in [0, 1): a fraction of the data held out (1 would leave nothing to train on)."""
    if not check_number(value, flag, 0.0, 1.0) < 1.0:
        raise EulerError(f"{flag} must be a finite number in [0, 1), got {value}")
    return value


def tokenizer_file(path: Path) -> Path:
    """The file that --tokenizer names: a tokenizer JSON, a prepared folder's, or a
    checkpoint (a .safetensors file, or a run folder's checkpoint) that carries one."""
    from euler.data.prepare import TOKENIZER_FILE
    from euler.training.checkpoint import CHECKPOINT_NAME

    path = Path(path)
    if path.is_dir() and not (path / TOKENIZER_FILE).exists() and (path / CHECKPOINT_NAME).exists():
        return path / CHECKPOINT_NAME
    return path / TOKENIZER_FILE if path.is_dir() else path


def load_tokenizer(path: Path) -> Tokenizer:
    """A Tokenizer from a file, a prepared data folder's tokenizer.json, or the one a
    checkpoint carries (an imported model's foreign tokenizer and chat template)."""
    from euler.tokenizer import Tokenizer

    folder = Path(path)
    path = tokenizer_file(path)
    if path.suffix == ".safetensors" and path.is_file():
        from euler.training.checkpoint import read_tokenizer

        return read_tokenizer(path)
    if not path.is_file():
        raise EulerError(f"--tokenizer: tokenizer file not found: {path}")
    if folder.is_dir() and (folder / "manifest.json").is_file():  # checked as train checks it
        from euler.data.manifest import folder_tokenizer, read_manifest

        return folder_tokenizer(folder, read_manifest(folder))
    return Tokenizer.load(path)


@data_app.command()
def prepare(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (shards, manifest).")],
    books: Annotated[
        list[str] | None,
        typer.Option(help="Gutenberg .txt file, folder, URL or ebook number (repeatable)."),
    ] = None,
    web: Annotated[
        list[str] | None,
        typer.Option(
            help="Web .parquet/.jsonl file, WikiExtractor file, folder or URL "
            "(a URL may end in #sha256=<hex> to be checked)."
        ),
    ] = None,
    books_weight: Annotated[
        float | None,
        typer.Option(help="Sampling weight of books (default: by tokens; an unset one is 1)."),
    ] = None,
    web_weight: Annotated[
        float | None, typer.Option(help="Sampling weight of web text (see --books-weight).")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Tokenizer file (or a prepared folder) to encode with.")
    ] = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Train a tokenizer of this size on the sources.")
    ] = None,
    val_fraction: Annotated[float, typer.Option(help="Fraction of documents held out.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the train/validation split.")] = 0,
    text_column: Annotated[str, typer.Option(help="Text column of parquet/jsonl files.")] = "text",
    threads: Annotated[int, typer.Option(help="Tokenizer threads (0: all cores).")] = 0,
    tokenizer_sample_mb: Annotated[
        float, typer.Option(help="Million characters sampled to train a tokenizer.")
    ] = 20.0,
    gutenberg_mirror: Annotated[
        str, typer.Option(help="Project Gutenberg site that ebook numbers are fetched from.")
    ] = "https://www.gutenberg.org",
    overwrite: Overwrite = False,
    json_out: JsonOut = None,
) -> None:
    """Tokenize books and web text into train/val shards with a manifest."""
    from euler.tokenizer import FIRST_MERGE_ID, MAX_VOCAB_SIZE

    from euler.data.corpus import file_source
    from euler.data.files import check_output
    from euler.data.prepare import prepare_corpus

    if not books and not web:
        raise EulerError("give at least one --books or --web input")
    if (tokenizer is None) == (vocab_size is None):
        raise EulerError("give exactly one of --tokenizer and --vocab-size")
    for flag, weight in (("--books-weight", books_weight), ("--web-weight", web_weight)):
        if weight is not None:
            check_number(weight, flag, 0.0, lo_open=True)
    if vocab_size is not None:
        check_int(vocab_size, "--vocab-size", FIRST_MERGE_ID, MAX_VOCAB_SIZE)
    check_fraction(val_fraction, "--val-fraction")
    check_int(seed, "--seed", 0, MAX_SEED)
    check_int(threads, "--threads", 0, MAX_THREADS)
    check_number(tokenizer_sample_mb, "--tokenizer-sample-mb", 0.0, 1e6, lo_open=True)
    reads = [("--tokenizer", tokenizer_file(tokenizer))] if tokenizer is not None else []
    local = lambda items: [i for i in items or () if Path(i).exists()]  # not URLs, numbers
    given = [(flag, Path(i)) for flag, items in (("--books", books), ("--web", web))
             for i in local(items)]  # fmt: skip
    check_output(out, overwrite, reads + given)  # before any download or tokenizer training
    json_output.claim(json_out, "data prepare", [*reads, *given])
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    weighted = books_weight is not None or web_weight is not None
    sources = []
    for kind, items, weight in (("books", books, books_weight), ("web", web, web_weight)):
        if items:
            w = (1.0 if weight is None else weight) if weighted else None
            sources.append(file_source(kind, items, w, text_column, mirror=gutenberg_mirror))
    manifest = prepare_corpus(
        sources,
        out,
        tokenizer=tok,
        vocab_size=vocab_size,
        val_fraction=val_fraction,
        seed=seed,
        threads=threads or None,
        tokenizer_sample_chars=max(1, int(tokenizer_sample_mb * 1e6)),
        # progress on stdout (stderr holds errors only), unless the JSON takes stdout
        log=json_output.console(json_out).print,
        overwrite=overwrite,
        reads=reads,
    )
    _print_summary(out, manifest, json_output.console(json_out))
    json_output.emit(json_out, "data prepare", pretrain_report(out, manifest))


def pretrain_report(folder: Path, manifest: dict) -> dict:
    """The numbers of a pretraining preparation's table, for --json."""
    return {"folder": str(folder), "kind": "pretrain", "sources": manifest["sources"],
            "totals": manifest["totals"]}  # fmt: skip


def _print_summary(out: Path, manifest: dict, console) -> None:
    """Tokens per source, throughput and validation fraction of a preparation."""
    console.print(pretrain_table(out, manifest))
    t = manifest["totals"]
    speed = "?" if t["mb_per_s"] is None else f"{t['mb_per_s']:.2f}"
    console.print(
        f"{t['text_bytes'] / 1e6:.1f} MB in {t['seconds']:.1f} s = {speed} MB/s "
        f"on {t['threads']} threads; {t['bytes_per_token']:.2f} bytes/token; "
        f"validation {t['val_token_fraction']:.3f} of tokens"
    )


def pretrain_table(out: Path, manifest: dict):
    """The per-source table of a pretraining preparation, 80 columns wide (the source's
    name folded, never cut to an ellipsis)."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"prepared {out}", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("source", overflow="fold")
    for col in ("weight", "docs", "MB", "train tokens", "val tokens", "val frac"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in manifest["sources"]:
        n = s["tokens"]["train"] + s["tokens"]["val"]
        table.add_row(
            s["name"],
            "by tokens" if s["weight"] is None else f"{s['weight']:g}",
            str(s["documents"]["train"] + s["documents"]["val"]),
            f"{(s['text_bytes']['train'] + s['text_bytes']['val']) / 1e6:.1f}",
            f"{s['tokens']['train']:,}",
            f"{s['tokens']['val']:,}",
            f"{s['tokens']['val'] / max(n, 1):.3f}",
        )
    return table


@data_app.command("prepare-sft")
def prepare_sft_command(
    inputs: Annotated[list[str], typer.Argument(help="Alpaca JSON files or URLs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    tokenizer: Annotated[
        Path,
        typer.Option(
            help="Tokenizer file, the pretraining data folder that holds it, or a run folder "
            "or checkpoint (an imported model's own tokenizer and chat template)."
        ),
    ],
    seq_len: Annotated[
        int,
        typer.Option(
            help="T: tokens per window, which the records must fit; euler sft trains at this "
            "length (at most the model's context)."
        ),
    ] = 128,
    long: Annotated[
        str,
        typer.Option(
            help="A record longer than the context: cut (its response at the last sentence "
            "end that fits, closed by the end token: <|end|>, ChatML's <|im_end|>), truncate "
            "(at the context, no end token) or drop."
        ),
    ] = "cut",
    pack: Annotated[
        bool, typer.Option(help="Pack several whole records into each window of the context.")
    ] = True,
    max_answer: Annotated[
        int,
        typer.Option(
            help="Longest response in tokens, its end token included, a longer one treated as "
            "--long "
            "says: at 40, greedy answers of the `small` model end within 64 tokens "
            "(docs/sft-policy.md); 0: what the context leaves."
        ),
    ] = 40,
    val_fraction: Annotated[float, typer.Option(help="Fraction of records held out.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the train/validation split.")] = 0,
    overwrite: Overwrite = False,
    json_out: JsonOut = None,
    context_old: Annotated[int | None, deprecated("--context", "--seq-len")] = None,
) -> None:
    """Render Alpaca records in the chat template into SFT windows with loss masks."""
    from euler.data.manifest import MAX_CONTEXT
    from euler.data.sft import prepare_sft
    from euler.data.sft_policy import check_long

    context = renamed(context_old, seq_len, "--context", "--seq-len", 128)
    check_int(context, "--seq-len", 2, MAX_CONTEXT)
    check_long(long)
    check_int(max_answer, "--max-answer", 0, MAX_CONTEXT)
    check_fraction(val_fraction, "--val-fraction")
    check_int(seed, "--seed", 0, MAX_SEED)
    reads = [("--tokenizer", tokenizer_file(tokenizer))]
    json_output.claim(json_out, "data prepare-sft", reads)
    tok = load_tokenizer(tokenizer)
    m = prepare_sft(inputs, out, tok, context, val_fraction, seed, overwrite=overwrite,
                    reads=reads, long=long, pack=pack, max_answer=max_answer)  # fmt: skip
    _print_sft_summary(m, json_output.console(json_out))
    json_output.emit(json_out, "data prepare-sft", sft_report(out, m))


def sft_report(folder: Path, m: dict) -> dict:
    """The numbers of an SFT preparation's table and its kept line, for --json."""
    from euler.data.sft import kept_line

    keys = ("records", "context", "policy", "too_long_rule", "splits", "heldout")
    return {"folder": str(folder), "kind": "sft", **{k: m[k] for k in keys if k in m},
            "kept": kept_line(m)}  # fmt: skip


def sft_table(m: dict):
    """The per-split table of an SFT manifest, 80 columns wide: short headers (trunc.:
    truncated; rec/win: records a window; loss: the loss share), no column rules."""
    from rich import box
    from rich.table import Table

    context, policy = m["context"], m["policy"]
    answer = f"answers of at most {policy['max_answer']} tokens; " if policy["max_answer"] else ""
    layout = "packed" if policy["pack"] else "one per window"
    table = Table(title=f"{m['records']} records, context {context}; {answer}long records: "
                  f"{m['too_long_rule']}; {layout}", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 0))  # fmt: skip
    cols = ("split", "records", "whole", "cut", "trunc.", "dropped", "windows", "rec/win",
            "tokens", "loss")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for split, s in m["splits"].items():
        table.add_row(
            split, *(f"{s[k]:,}" for k in ("records", "whole", "cut", "truncated", "dropped")),
            f"{s['windows']:,}", f"{s['records_per_window']:.2f}", f"{s['tokens']:,}",
            f"{s['loss_fraction_of_windows']:.3f}",
        )  # fmt: skip
    return table


def _print_sft_summary(m: dict, console) -> None:
    """Records kept whole, cut, truncated and dropped per split; windows and the loss share;
    then one line on the share kept, why the rest was dropped, and the flag that keeps more."""
    from euler.data.sft import kept_line

    console.print(sft_table(m))
    # one line whatever the width: the share kept, and why
    print(kept_line(m), file=console.file, flush=True)
    console.print(
        f"trunc.: truncated; rec/win: records a window; loss: the share of the "
        f"{m['context'] + 1}-token window positions that are response tokens. Held-out "
        f"records as given: {m['heldout']['file']} (for euler eval --instructions)"
    )


@data_app.command()
def info(
    folder: Annotated[Path, typer.Argument(help="A folder made by prepare or prepare-sft.")],
    json_out: JsonOut = None,
) -> None:
    """Summarise a prepared folder from its manifest."""
    from euler.data.manifest import read_manifest

    json_output.claim(json_out, "data info", [("FOLDER", folder)])
    m = read_manifest(folder)
    tok = m["tokenizer"]
    console = json_output.console(json_out)
    console.print(f"{m['kind']} data, tokenizer V={tok['vocab_size']} sha256 {tok['sha256'][:12]}")
    if m["kind"] == "pretrain":
        _print_summary(folder, m, console)
        doc = pretrain_report(folder, m)
    else:
        _print_sft_summary(m, console)
        doc = sft_report(folder, m)
    json_output.emit(json_out, "data info", {**doc, "tokenizer": tok})


@data_app.command()
def download(
    url: Annotated[str, typer.Argument(help="http(s) URL.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Destination file (default: the cache).")
    ] = None,
    sha256: Annotated[str | None, typer.Option(help="Expected SHA-256 (hex).")] = None,
    size: Annotated[int | None, typer.Option(help="Expected size in bytes.")] = None,
) -> None:
    """Download a file into the cache (resumable) and print its path."""
    from euler.data.download import check_sha256
    from euler.data.download import download as fetch

    if sha256 is not None:
        check_sha256(sha256, "--sha256")
    if size is not None:
        check_int(size, "--size", 0, 2**63 - 1)
    print(fetch(url, out, sha256=sha256, size=size))


@data_app.command()
def verify(
    folder: Annotated[Path, typer.Argument(help="A folder made by prepare or prepare-sft.")],
) -> None:
    """Read every file of a prepared folder against its manifest's checksums and ids."""
    from euler.data.verify import verify_folder

    r = verify_folder(folder)
    print(
        f"{folder}: ok, {r['kind']} data, {r['files']} files, {r['bytes'] / 1e6:.1f} MB "
        f"verified in {r['seconds']:.2f} s"
    )


def register(app: typer.Typer) -> None:
    """Add the `data` command family to the app."""
    app.add_typer(data_app, name="data")
