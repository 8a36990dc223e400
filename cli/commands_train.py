"""Life-cycle commands: `euler train`, `euler sft`, `euler chat` and `euler plot`."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import typing
from pathlib import Path
from typing import Annotated

import typer
from euler.cli.options import (
    CHECKPOINT_HELP,
    OLD_POSITIONAL,
    DecodeThreads,
    Threads,
    deprecated,
    note_renamed,
    positional,
)

from euler.errors import EulerError
from euler.precision import precision_help
from euler.training.config import (
    RESUME_FLAGS,
    TrainConfig,
    check_int,
    flag_default,
    flag_name,
    flag_of,
)

MAX_NPROC = 1024
OLD = "__old"  # the suffix of an old spelling's parameter
GIVEN_SOURCES = ("COMMANDLINE", "ENVIRONMENT")  # a flag the user gave, not its default
MAX_CHAT_TOKENS = 1 << 20  # --max-tokens; the model's context stops an answer long before
RESUMABLE = ", ".join(flag_name(name) for name in RESUME_FLAGS) + " and --nproc"
Device = Annotated[str, typer.Option(help="cpu, or cuda (needs the gpu extra and a GPU).")]
Resume = Annotated[
    Path | None,
    typer.Option(
        help="Continue this run folder from its checkpoint, with the settings in its "
        f"run.json. Only {RESUMABLE} may be given with it; a longer --steps stretches the "
        "cosine schedule from the resumed step on."
    ),
]
DEFAULT_TEMPERATURE = 0.8  # the chat REPL's sampling; --prompt and --speculative: greedy
Overwrite = Annotated[
    bool, typer.Option(help="Replace a run that --out already holds (not while it trains).")
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        help="TOML or JSON file of these settings by run.json's names (n_layer = 6), or a "
        "run's run.json; flags given beside it win."
    ),
]
Nproc = Annotated[
    int,
    typer.Option(
        help="Data-parallel ranks: re-run this command under mpiexec with N processes, each "
        "on its own rows of every batch (needs the dist extra; under mpiexec, leave it out)."
    ),
]


def train_config_parameters(kind: str, config: type = TrainConfig) -> list[inspect.Parameter]:
    """The typer parameters of the config fields that the command running `kind` sets by
    flag, in field order: each named as its field, with the field's flag, help and default."""
    hints = typing.get_type_hints(config)
    params = []
    for f in dataclasses.fields(config):
        flag = flag_of(f)
        if flag is None or kind not in flag.kinds:
            continue
        annotation, default = hints[f.name], flag_default(f, kind)
        if flag.path:
            annotation = Path if default is not None else Path | None
            default = Path(default) if default is not None else None
        helptext = flag.sft_help if kind == "sft" and flag.sft_help else flag.help
        option = typer.Option(*flag.decls, help=helptext)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[annotation, option]))  # fmt: skip
        if flag.old:  # the old spelling, hidden; its value lands in the field (_take_old)
            old = Annotated[annotation | None, deprecated(flag.old, flag_name(f.name))]
            params.append(inspect.Parameter(f.name + OLD, inspect.Parameter.KEYWORD_ONLY,
                                            default=None, annotation=old))  # fmt: skip
    return params


def _take_old(options: dict, names: list[str], given: set[str]) -> None:
    """Move each old spelling's value (popped from `options`) to its field, with a note;
    the field given under both spellings is refused."""
    for name in [n for n in names if n.endswith(OLD)]:
        value, field_name = options.pop(name), name.removesuffix(OLD)
        if value is None:
            continue
        field = next(f for f in dataclasses.fields(TrainConfig) if f.name == field_name)
        old, new = flag_of(field).old, flag_name(field_name)
        if field_name in given:
            raise EulerError(f"{old} is the old spelling of {new}: give only {new}")
        note_renamed(old, new)
        options[field_name] = value
        given.add(field_name)


def _train_config_options(kind: str):
    """Decorator: the command (settings, given, **its own options) gets TrainConfig's flags
    for `kind` ahead of its own options, and receives their values as the dict `settings`
    and the names of those the command line (or the environment) gave as the set `given`."""

    def decorate(command):
        _, _, *own = inspect.signature(command, eval_str=True).parameters.values()
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        fields = train_config_parameters(kind)
        names = [p.name for p in fields]

        def typer_command(ctx: typer.Context, **options):
            # the parameter source tells a flag given from one left at its default (typer
            # vendors click: the source is known by its name)
            given = {n for n in names if ctx.get_parameter_source(n).name in GIVEN_SOURCES}
            _take_old(options, names, given)
            fields = [n for n in names if not n.endswith(OLD)]
            return command({name: options.pop(name) for name in fields}, given, **options)

        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation=typer.Context)  # fmt: skip
        typer_command.__signature__ = inspect.Signature([context, *fields, *own])
        typer_command.__name__, typer_command.__doc__ = command.__name__, command.__doc__
        return typer_command

    return decorate


def _train_config(kind: str, settings: dict) -> TrainConfig:
    """The TrainConfig of a command's flags (paths stored as strings)."""
    values = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    return TrainConfig(kind=kind, **values)


def _with_config_file(kind: str, settings: dict, given: set[str], config: Path) -> TrainConfig:
    """The TrainConfig of --config's settings, each replaced by its flag where one was given;
    an impossible result is refused naming the file and the flag."""
    from euler.training.config import read_config_file

    values = read_config_file(config, kind)
    merged = {**settings, **{k: v for k, v in values.items() if k not in given}}
    if kind == "sft":
        _sft_inputs_given(merged["init_from"], merged["data"])
    try:
        return _train_config(kind, merged)
    except EulerError as e:
        raise EulerError(f"--config {config} with the flags given: {e}") from None


def _sft_inputs_given(init_from: object, data: object) -> None:
    """Refuse an sft run without its two inputs (flags, or --config's settings)."""
    if init_from is None or data is None:
        raise EulerError("sft needs --checkpoint CHECKPOINT and --data SFT_FOLDER (or --resume)")


def _run(kind: str, settings: dict, given: set[str], resume: Path | None, overwrite: bool,
         nproc: int, threads: int | None = None, config: Path | None = None) -> None:  # fmt: skip
    """Start or resume a run; exit 130 after a Ctrl-C (the checkpoint is saved).

    The run folder's lock is held from before run.json is read until the run ends. nproc > 1
    outside mpiexec starts this same command line as nproc MPI ranks (once the lock is
    let go: rank 0 takes it) and exits with their exit code; under mpiexec it must match
    the ranks mpiexec started. threads (default: the usable cores) are shared among the
    ranks; a rank computes on the threads its launcher gave it.
    """
    from euler.threads import pick_threads, use_threads
    from euler.training import distributed
    from euler.training.loop import train
    from euler.training.resume import run_inputs
    from euler.training.run_folder import check_folder, check_run_dir, lock_run

    check_int(nproc, "--nproc", 1, MAX_NPROC)
    if threads is not None:
        pick_threads(threads)  # a bad count is refused before any work
    if resume is not None and config is not None:
        raise EulerError("--config starts a run, --resume continues one with its run.json: "
                         "give one of them")  # fmt: skip
    if resume is None:
        if config is not None:
            tc = _with_config_file(kind, settings, given, config)
        else:
            tc = _train_config(kind, settings)
        check_run_dir(Path(tc.out_dir), overwrite, run_inputs(tc))  # before the lock's file
    else:
        _refuse_resume_conflicts(given, overwrite)
        check_folder(resume)
    launched = distributed.launched_size()
    if nproc > 1 and launched not in (1, nproc):
        raise EulerError(f"--nproc {nproc}, but mpiexec started {launched} ranks")
    relaunch = nproc > 1 and launched == 1
    if launched > 1:
        use_threads(None)  # the launcher sized this rank's pool
    elif not relaunch:
        use_threads(threads)
    folder = resume if resume is not None else Path(tc.out_dir)
    owner = distributed.launched_rank() == 0
    # under mpiexec: one rank's error stops every rank
    with distributed.abort_on_error(), lock_run(folder, create=resume is None, owner=owner):
        if resume is not None:
            tc = _resumed_config(kind, resume, settings, given)
        if relaunch:
            distributed.check_batch(tc.batch_size, nproc)  # before starting any rank
        else:
            summary = train(tc, resume=resume is not None, overwrite=overwrite)
    if relaunch:
        per_rank = None if threads is None else max(1, pick_threads(threads) // nproc)
        sys.exit(distributed.relaunch(nproc, sys.argv[1:], per_rank))
    if summary["interrupted"]:
        # SystemExit, not typer.Exit: in main()'s non-standalone mode click would turn an Exit
        # into a return value, and the code would be lost
        sys.exit(130)


def _refuse_resume_conflicts(given: set[str], overwrite: bool) -> None:
    """Refuse flags given with --resume that it would ignore: the run keeps its run.json's
    settings, but for RESUME_FLAGS."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    ignored = [flag_name(n) for n in names if n in given and n not in RESUME_FLAGS]
    if ignored:
        raise EulerError(
            f"--resume continues a run with the settings in its run.json; it would ignore "
            f"{', '.join(ignored)} (only {RESUMABLE} may be given with --resume)"
        )
    if overwrite:
        raise EulerError("--overwrite replaces a run, --resume continues it: give one of them")


def _resumed_config(kind: str, run: Path, settings: dict, given: set[str]) -> TrainConfig:
    """The TrainConfig that continues RUN: its run.json's, with the RESUME_FLAGS given."""
    from euler.training.run_folder import read_run

    saved, _ = read_run(run)
    if saved.kind != kind:
        command = "train" if saved.kind == "pretrain" else "sft"
        raise EulerError(
            f"{run} holds a {saved.kind} run: continue it with `euler {command} --resume {run}`"
        )
    changes = {name: settings[name] for name in RESUME_FLAGS if name in given}
    if "steps" in changes and saved.tokens:
        raise EulerError(
            f"--steps: {run} runs for --tokens {saved.tokens}, which sets its steps; "
            "it cannot be given more steps"
        )
    return dataclasses.replace(saved, out_dir=str(run), **changes)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("train")
    @_train_config_options("pretrain")
    def train_command(
        settings: dict,
        given: set[str],
        resume: Resume = None,
        overwrite: Overwrite = False,
        nproc: Nproc = 1,
        threads: Threads = None,
        config: ConfigFile = None,
    ) -> None:
        """Pretrain a model on token shards (or on the embedded default corpus)."""
        _run("pretrain", settings, given, resume, overwrite, nproc, threads, config)

    @app.command("sft")
    @_train_config_options("sft")
    def sft_command(
        settings: dict,
        given: set[str],
        resume: Resume = None,
        overwrite: Overwrite = False,
        nproc: Nproc = 1,
        threads: Threads = None,
        config: ConfigFile = None,
    ) -> None:
        """Fine-tune on instructions; the loss counts response tokens only."""
        if resume is None and config is None:
            _sft_inputs_given(settings["init_from"], settings["data"])
        _run("sft", settings, given, resume, overwrite, nproc, threads, config)

    @app.command("chat")
    def chat_command(
        checkpoint: Annotated[Path, typer.Option(help=CHECKPOINT_HELP)],
        prompt: Annotated[
            str | None, typer.Option(help="Answer this one instruction and exit (for scripts).")
        ] = None,
        max_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 96,
        temperature: Annotated[
            float | None,
            typer.Option(
                help=f"0: greedy. Default: 0 with --prompt (as euler eval) or --speculative, "
                f"{DEFAULT_TEMPERATURE} in the REPL.",
                show_default=False,
            ),
        ] = None,
        top_k: Annotated[int, typer.Option(help="Keep the k likeliest tokens (0: all).")] = 40,
        top_p: Annotated[float, typer.Option(help="Nucleus: smallest set with this mass.")] = 0.95,
        seed: Annotated[int, typer.Option(help="Seed of the sampling.")] = 0,
        speculative: Annotated[
            bool,
            typer.Option(
                help="Greedy decoding sped up by drafting with the MTP heads; prints the "
                "acceptance rate and the speed-up over plain greedy."
            ),
        ] = False,
        device: Device = "cpu",
        precision: Annotated[
            str | None,
            typer.Option(
                help=precision_help("chat") + " cuda: bf16 recomputes the context in bf16; "
                "fp32 or tf32 decode with the KV cache in fp32, as the cpu does."
            ),
        ] = None,
        threads: DecodeThreads = None,
    ) -> None:
        """Chat with a checkpoint: a REPL (/reset, Ctrl-D to quit) or one --prompt.

        Both devices decode with a KV cache in fp32; --device cuda --precision bf16
        recomputes the whole context per step on the GPU in bf16 instead.

        Long prompts: the newest turns that fit in the context minus the room kept for the
        answer (min(max tokens, context/2)) are kept; a single prompt longer than that keeps
        its last tokens.
        """
        import numpy as np

        from euler.inference.generate import ChatSession
        from euler.inference.sampling import SamplingConfig
        from euler.threads import pick_threads
        from euler.training import checkpoint as ckpt

        # every flag is checked before the checkpoint is read
        if threads is not None:
            pick_threads(threads)
        check_int(max_tokens, "--max-tokens", 1, MAX_CHAT_TOKENS)
        check_int(seed, "--seed", 0, 2**63 - 1)
        if speculative and temperature not in (None, 0.0):
            raise EulerError(f"--speculative decodes greedily (drafts checked against head "
                             f"0's argmax): --temperature {temperature} cannot apply; drop "
                             "it or give --temperature 0")  # fmt: skip
        if temperature is None:  # greedy: the drafts are checked against head 0's argmax,
            # and a scripted answer is eval's (greedy), the same on every run
            temperature = 0.0 if speculative or prompt is not None else DEFAULT_TEMPERATURE
        sampling = SamplingConfig(temperature, top_k, top_p)
        if device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {device!r}")
        precision = chat_precision(device, precision)
        if prompt is not None:
            prompt = _check_text(prompt, "--prompt")
        ck = ckpt.load(checkpoint)
        tok = ck.tokenizer()
        decoder = _decoder_factory(
            ck, device, precision, pick_threads(threads) if threads is not None else 1
        )
        session = ChatSession(decoder(), tok)
        rng = np.random.default_rng(seed)
        if prompt is not None:
            _answer(session, prompt, max_tokens, sampling, rng, speculative, decoder, sys.stderr)
            return
        print(f"chat with {ck.path} (step {ck.step}); /reset forgets the conversation, "
              "Ctrl-D quits", flush=True)  # fmt: skip
        tty = sys.stdin.isatty()
        if tty:  # line editing (arrow keys) and a history (up arrow) for input()
            with contextlib.suppress(ImportError):
                import readline  # noqa: F401
        while True:
            try:
                text = _read_line(tty).strip()
            except (KeyboardInterrupt, EOFError):  # Ctrl-C, Ctrl-D / end of input
                print()
                return
            except UnicodeDecodeError as e:
                print(f"error: that input is not UTF-8 (byte {e.start}); type it again", flush=True)
                continue
            if not text:
                continue
            if text.startswith("/"):
                if text == "/reset":
                    session.reset()
                    print("(conversation cleared)", flush=True)
                else:
                    print("commands: /reset, and Ctrl-D to quit", flush=True)
                continue
            try:
                _answer(session, text, max_tokens, sampling, rng, speculative, decoder)
            except KeyboardInterrupt:  # Ctrl-C stops this answer, not the chat
                print("\n(stopped)", flush=True)

    @app.command("plot", context_settings=OLD_POSITIONAL)
    def plot_command(
        ctx: typer.Context,
        checkpoint: Annotated[
            list[Path] | None,
            typer.Option(
                help="A run folder (or a checkpoint in one) whose metrics.jsonl to plot; "
                "repeat it to overlay runs.",
                show_default=False,
            ),
        ] = None,
        out: Annotated[
            Path | None,
            typer.Option("--out", "-o", help="PNG path (default: the first run's loss.png)."),
        ] = None,
    ) -> None:
        """Write a PNG of the next-token loss of a run (training and validation, the MTP
        heads' mean beside it), or of runs overlaid."""
        from euler.cli.plot import plot_runs

        if ctx.args:
            checkpoint = positional(ctx.args, checkpoint, "--checkpoint RUN")
        if not checkpoint:
            raise EulerError("give --checkpoint RUN: a run folder holding metrics.jsonl")
        # a run's checkpoint stands for its run folder (the metrics lie beside it)
        runs = [c.parent if c.suffix == ".safetensors" and c.is_file() else c for c in checkpoint]
        path = plot_runs(runs, out or runs[0] / "loss.png")
        print(f"wrote {path}")


def _read_line(tty: bool) -> str:
    """One line typed at the chat's `you> ` prompt; EOFError at the end of input. A terminal
    reads through input() (readline's editing and history once it is imported); a pipe
    reads bytes, so that bad UTF-8 is reported and skipped, not fatal."""
    if tty:
        return input("you> ")
    sys.stdout.write("you> ")
    sys.stdout.flush()
    line = sys.stdin.buffer.readline()
    if not line:
        raise EOFError
    return line.decode("utf-8")


def _check_text(text: str, what: str) -> str:
    """Refuse text that is empty or not UTF-8 (undecodable argv bytes arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise EulerError(f"{what} is not valid UTF-8") from None
    if not text.strip():
        raise EulerError(f"{what} is empty")
    return text


def chat_precision(device: str, precision: str | None, command: str = "chat") -> str:
    """The precision `euler chat` (or eval) decodes in: euler.precision.ACCEPTED's default
    on device, or the one given where the table accepts it; else its one-line refusal."""
    from euler.precision import resolve_precision

    return resolve_precision(device, precision, command)


def _decoder_factory(ck, device: str, precision: str, threads: int = 1):
    """A function making fresh decoders of checkpoint ck on device (cpu or cuda): with a KV
    cache in fp32 (its CPU kernels on `threads` threads), or under bf16 recomputing the
    context in bf16 (make_decoder)."""
    from euler.backend import make_backend
    from euler.inference.decode_device import make_decoder

    backend = make_backend(device, precision)
    return lambda: make_decoder(ck.cfg, ck.params, backend, precision, threads)


def _answer(session, text, max_tokens, sampling, rng, speculative, decoder, notes=None) -> None:
    """Stream one answer to stdout, then a line of statistics; decoder() makes a decoder.

    notes: where the `euler> ` prefix, the notices and the statistics go (stdout in the
    REPL; stderr for --prompt, so that stdout holds the answer alone)."""
    from euler.inference.generate import TextStream, generate, generate_speculative

    notes = notes or sys.stdout
    stream = TextStream(session.tok)
    prefix = ["euler> "]  # on stderr, written with the first token: an error stays one line

    def say_prefix() -> None:
        if prefix:
            notes.write(prefix.pop())
            notes.flush()

    if notes is sys.stdout:
        say_prefix()

    def show(t: int) -> None:
        say_prefix()
        sys.stdout.write(stream.push(t))
        sys.stdout.flush()

    res, cut = session.reply(text, max_tokens, sampling, rng, speculative, show)
    say_prefix()
    sys.stdout.write(stream.flush() + "\n")
    sys.stdout.flush()
    if cut:
        print("(the prompt was longer than the context allows: only its last tokens were used)",
              file=notes)  # fmt: skip
    why = {"end": "", "max": " (--max-tokens reached)", "context": " (context full)"}[res.stop]
    line = f"[{len(res.tokens)} tokens, {res.tokens_per_second:.1f} tok/s{why}]"
    if speculative:
        # plain greedy and speculative decoding of the same context again, silently, each
        # timed best of three: the streamed answer's time includes the terminal, and a
        # shared machine's load comes and goes
        stop, ctx = (session.tok.end_id, session.tok.eot_id), session.last_context

        def best(decode):
            return min((decode(decoder()) for _ in range(3)),
                       key=lambda r: r.seconds)  # fmt: skip

        base = best(lambda d: generate(d, ctx, max_tokens, sampling, rng, stop))
        spec = best(lambda d: generate_speculative(d, ctx, max_tokens, stop))
        same = "identical" if base.tokens == res.tokens == spec.tokens else "DIFFERENT"
        speed = base.seconds / spec.seconds if spec.seconds > 0 else float("nan")
        line += (
            f" speculative: {res.accepted}/{res.drafted} drafts accepted "
            f"({100 * res.acceptance:.0f}%), {len(res.tokens) / max(res.forward_calls, 1):.2f}"
            f" tokens per forward; {spec.tokens_per_second:.0f} vs {base.tokens_per_second:.0f}"
            f" tok/s plain greedy (best of 3): {speed:.2f}x; output {same}"
        )
    print(line, file=notes, flush=True)
