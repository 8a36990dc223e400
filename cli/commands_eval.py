"""`euler eval`: held-out bits per byte on text, and greedy answers to instructions."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from euler.cli import json_output
from euler.cli.options import CHECKPOINT_HELP, OLD_POSITIONAL, Threads, positional

from euler.errors import EulerError
from euler.precision import precision_help

SHOWN = 3  # answers printed beside the table


def register(app: typer.Typer) -> None:
    """Add the eval command to the app."""

    @app.command("eval", context_settings=OLD_POSITIONAL)
    def eval_command(
        ctx: typer.Context,
        checkpoint: Annotated[
            Path | None, typer.Option(help=CHECKPOINT_HELP, show_default=False)
        ] = None,
        text: Annotated[
            list[Path] | None,
            typer.Option(
                help="Text to score in bits per byte: a .txt file or folder (books), "
                "WikiExtractor, JSONL or Parquet files, or a folder from `euler data "
                "prepare` (its held-out split). Repeat for several sources."
            ),
        ] = None,
        text_tokens: Annotated[
            int,
            typer.Option(
                help="Score only the first N tokens of each --text source, its bytes counted "
                "over them (0: all)."
            ),
        ] = 0,
        instructions: Annotated[
            Path | None,
            typer.Option(help="Alpaca JSON file of instructions to answer greedily."),
        ] = None,
        max_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 64,
        limit: Annotated[
            int, typer.Option(help="Answer only the first N instructions (0: all).")
        ] = 0,
        device: Annotated[str, typer.Option(help="cpu, or cuda (needs the gpu extra).")] = "cpu",
        precision: Annotated[str | None, typer.Option(help=precision_help("eval"))] = None,
        json_out: Annotated[
            Path | None,
            typer.Option(
                "--json",
                help="Also write the results as JSON to this file; '-': to stdout alone (the "
                "tables then go to stderr).",
                show_default=False,
            ),
        ] = None,
        overwrite: Annotated[bool, typer.Option(help="Replace an existing --json file.")] = False,
        threads: Threads = None,
    ) -> None:
        """Score a checkpoint: bits per byte on --text, answers to --instructions."""
        from euler.cli.commands_bench import check_json_out
        from euler.cli.commands_data import check_int
        from euler.cli.commands_train import chat_precision

        from euler import ownership
        from euler.threads import use_threads
        from euler.training import checkpoint as ckpt

        if ctx.args:
            if len(ctx.args) > 1:
                raise EulerError(f"unexpected argument {ctx.args[1]!r}")
            checkpoint = positional(ctx.args, checkpoint, "--checkpoint CHECKPOINT")[0]
        if checkpoint is None:
            raise EulerError("give --checkpoint CHECKPOINT: a checkpoint file or a run folder")
        if not text and instructions is None:
            raise EulerError("give --text PATH and/or --instructions FILE")
        check_int(max_tokens, "--max-tokens", 1, 1 << 20)
        check_int(limit, "--limit", 0, 1 << 40)
        check_int(text_tokens, "--text-tokens", 0, 1 << 50)
        if text_tokens == 1:
            raise EulerError("--text-tokens 1 predicts nothing: give 2 or more (0: all)")
        if device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {device!r}")
        precision = chat_precision(device, precision, "eval")
        use_threads(threads)
        reads = [("--checkpoint", checkpoint), ("--instructions", instructions),
                 *(("--text", t) for t in text or ())]  # fmt: skip
        if not json_output.to_stdout(json_out):
            check_json_out(json_out, overwrite, ownership.EVAL_REPORT, reads)
        records = None
        if instructions is not None:
            from euler.data.sft import load_alpaca

            records = load_alpaca(instructions)
            if not records:
                raise EulerError(f"--instructions: {instructions}: no records")
            records = records[:limit] if limit else records
        ck = ckpt.load(checkpoint)
        console = json_output.console(json_out)
        if not console.is_terminal:
            console.width = max(console.width, 140)
        result: dict = {"report": "euler eval", "checkpoint": str(ck.path), "step": ck.step}
        if text:
            result["text"] = _eval_text(ck, text, device, precision, console, text_tokens)
        if records is not None:
            result["instructions"] = _eval_instructions(
                ck, records, instructions, max_tokens, device, precision, console
            )
        json_output.emit(json_out, "eval", result)


@contextlib.contextmanager
def _progress(console, what: str, total: int):
    """A rich progress bar; yields advance(n)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    cols = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*cols, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n=1: bar.advance(task, n)


def _eval_text(ck, paths: list[Path], device: str, precision: str, console,
               max_tokens: int = 0) -> dict:  # fmt: skip
    """Bits per byte per source (each cut to its first max_tokens tokens, 0: whole) and
    overall, printed as a table."""

    from euler.backend import make_backend
    from euler.eval.text import evaluate_text, load_text, n_windows

    sources = load_text(paths, ck, max_tokens)
    backend = make_backend(device, precision)
    with _progress(console, "scoring text", n_windows(sources, ck.cfg.context)) as advance:
        res = evaluate_text(ck, sources, backend, precision, on_batch=advance)
    console.print(text_table(res))
    return res


def text_table(res: dict):
    """evaluate_text's result as a table that fits 80 columns: next-token loss (head 0) in
    nats per token and bits per byte, the headline; the MTP heads' mean beside it, labelled
    in the caption; a source's name folded onto more lines, never cut to an ellipsis."""
    from rich import box
    from rich.table import Table

    K = res["mtp_heads"]
    table = Table(
        title=f"held-out text, {res['checkpoint']}: next-token loss (head 0), windows of "
        f"{res['context']} + 1 at stride {res['context']}",
        caption=f"nats/tok, bits/byte: next token (head 0). MTP mean: the mean of the {K} "
        "heads' nats/tok (the training objective)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("source", overflow="fold")
    # tokens per byte (bits per byte over nats per token, / ln 2) is in --json: at 80 columns
    # the source's name needs the room
    cols = ("docs", "tokens", "MB", "nats/tok", "bits/byte", "MTP mean")
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for row in [*res["sources"], res["overall"]]:
        table.add_row(
            row["source"],
            f"{row['documents']:,}",
            f"{row['tokens']:,}",
            f"{row['bytes'] / 1e6:.2f}",
            f"{row['nats_per_token']:.4f}",
            f"{row['bits_per_byte']:.4f}",
            f"{row['nats_per_token_mtp_mean']:.4f}",
        )
    return table


def _eval_instructions(
    ck, records: list[dict], path: Path, max_tokens: int, device: str, precision: str, console
) -> dict:
    """Greedy answers scored (ended, length, loops, ROUGE-L), a table and a few answers."""
    from euler.cli.commands_train import _decoder_factory
    from rich.table import Table

    from euler.data.chat_template import end_token
    from euler.eval.instructions import answer_records, summarize
    from euler.inference.generate import ChatSession

    tok = ck.tokenizer()  # its chat template renders the prompts; answers stop at its end token
    session = ChatSession(_decoder_factory(ck, device, precision)(), tok)
    with _progress(console, "answering", len(records)) as advance:
        answers = answer_records(session, records, max_tokens, on_record=advance)
    s = summarize(answers, max_tokens, path)
    table = Table(
        title=f"greedy answers to {s['records']} instructions of {path}, "
        f"at most {max_tokens} tokens"
    )
    # one metric a row (a row of six columns broke at 80), each named in full
    rows = {
        f"answers that end with {end_token(tok)} within {max_tokens} tokens":
            f"{s['ended_share']:.1%}",
        "mean tokens of an answer": f"{s['mean_tokens']:.1f}",
        f"answers that loop (a word {s['loop_n']}-gram {s['loop_times']}x)":
            f"{s['loop_share']:.1%}",
        f"references that loop in their first {max_tokens} tokens":
            f"{s['reference_loop_share']:.1%}",
        "ROUGE-L F1 against the whole references": f"{s['rouge_l']:.4f}",
        f"ROUGE-L F1 against the references' first {max_tokens} tokens":
            f"{s['rouge_l_budget']:.4f}",
    }  # fmt: skip
    table.add_column("metric", overflow="fold")
    table.add_column("value", justify="right", no_wrap=True)
    for name, value in rows.items():
        table.add_row(name, value)
    console.print(table)
    for a in answers[:SHOWN]:
        console.print(f"[bold]> {a['instruction']}[/bold]", markup=True, highlight=False)
        console.print(a["answer"] + ("" if a["ended"] else " [...]"), markup=False, highlight=False)
    return {**s, "end_token": end_token(tok), "answers": answers}
