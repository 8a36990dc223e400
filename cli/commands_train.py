"""Life-cycle commands: `euler train`, `euler sft`, `euler chat` and `euler plot`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from euler.errors import EulerError

# options shared by train and sft (their defaults differ, so each command sets its own)
Out = Annotated[Path, typer.Option("--out", "-o", help="Run folder (checkpoint, metrics).")]
Device = Annotated[str, typer.Option(help="cpu, or cuda (needs the gpu extra and a GPU).")]
BatchSize = Annotated[int, typer.Option(help="B: sequences per micro-batch.")]
SeqLen = Annotated[int, typer.Option(help="T: tokens per sequence (0: the model's context).")]
GradAccum = Annotated[int, typer.Option(help="Micro-batches per optimizer step.")]
Steps = Annotated[int, typer.Option(help="Optimizer steps (unless --tokens is given).")]
Tokens = Annotated[int, typer.Option(help="Token budget; sets the steps (0: use --steps).")]
Lr = Annotated[float, typer.Option(help="Peak learning rate (after warmup).")]
MinLr = Annotated[float, typer.Option(help="Learning rate at the end of the cosine decay.")]
Warmup = Annotated[int, typer.Option(help="Linear warmup steps.")]
WeightDecay = Annotated[float, typer.Option(help="AdamW decoupled weight decay (matrices only).")]
GradClip = Annotated[float, typer.Option(help="Clip the global gradient norm (0: off).")]
EvalEvery = Annotated[int, typer.Option(help="Steps between validation losses and samples.")]
EvalBatches = Annotated[int, typer.Option(help="Validation micro-batches per evaluation.")]
SampleTokens = Annotated[int, typer.Option(help="Tokens of the sample shown at evaluations.")]
CkptEvery = Annotated[int, typer.Option(help="Steps between checkpoints.")]
LogEvery = Annotated[int, typer.Option(help="Steps between log lines (non-terminal output).")]
Seed = Annotated[int, typer.Option(help="Seed of the weights, batches and samples.")]
Resume = Annotated[
    Path | None,
    typer.Option(help="Continue this run folder from its checkpoint (its saved settings)."),
]
Overwrite = Annotated[bool, typer.Option(help="Replace a run that --out already holds.")]
Tf32 = Annotated[
    bool, typer.Option(help="cuda: TF32 tensor cores for matrix products (--no-tf32: exact fp32).")
]
CudaGraph = Annotated[
    bool,
    typer.Option(
        help="cuda: capture each step's kernels once as CUDA graphs and replay them; "
        "--no-cuda-graph launches them one by one."
    ),
]
ExactAttention = Annotated[
    bool,
    typer.Option(help="cuda with TF32: attention in exact fp32 instead of on tensor cores."),
]
Nproc = Annotated[
    int,
    typer.Option(
        help="Data-parallel ranks: re-run this command under mpiexec with N processes, each "
        "on its own rows of every batch (needs the dist extra; under mpiexec, leave it out)."
    ),
]


def _run(tc, resume: Path | None, overwrite: bool, nproc: int = 1) -> None:
    """Start or resume a run; exit 130 after a Ctrl-C (the checkpoint is saved).

    nproc > 1 outside mpiexec starts this same command line as nproc MPI ranks and exits
    with their exit code; under mpiexec it must match the ranks mpiexec started.
    """
    from euler.training import distributed
    from euler.training.loop import read_run, train

    if resume is not None:
        tc, _ = read_run(resume)
        tc = type(tc).from_dict({**tc.to_dict(), "out_dir": str(resume)})
    if nproc < 1:
        raise EulerError("--nproc must be at least 1")
    launched = distributed.launched_size()
    if nproc > 1 and launched == 1:
        distributed.check_batch(tc.batch_size, nproc)  # before starting any rank
        sys.exit(distributed.relaunch(nproc, sys.argv[1:]))
    if nproc > 1 and launched != nproc:
        raise EulerError(f"--nproc {nproc}, but mpiexec started {launched} ranks")
    with distributed.abort_on_error():  # under mpiexec: one rank's error stops every rank
        summary = train(tc, resume=resume is not None, overwrite=overwrite)
    if summary["interrupted"]:
        # SystemExit, not typer.Exit: in main()'s non-standalone mode click would turn an Exit
        # into a return value, and the code would be lost
        sys.exit(130)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("train")
    def train_command(
        preset: Annotated[str, typer.Option(help="Model preset: tiny, small or gpu.")] = "small",
        data: Annotated[
            Path | None,
            typer.Option(help="Folder from `euler data prepare` (default: the embedded corpus)."),
        ] = None,
        out: Out = Path("runs/pretrain"),
        device: Device = "cpu",
        tf32: Tf32 = True,
        exact_attention: ExactAttention = False,
        cuda_graph: CudaGraph = True,
        batch_size: BatchSize = 8,
        seq_len: SeqLen = 0,
        grad_accum: GradAccum = 1,
        steps: Steps = 1000,
        tokens: Tokens = 0,
        lr: Lr = 3e-3,
        min_lr: MinLr = 3e-4,
        warmup: Warmup = 50,
        weight_decay: WeightDecay = 0.1,
        grad_clip: GradClip = 1.0,
        eval_every: EvalEvery = 100,
        eval_batches: EvalBatches = 8,
        sample_tokens: SampleTokens = 40,
        ckpt_every: CkptEvery = 100,
        log_every: LogEvery = 10,
        seed: Seed = 0,
        resume: Resume = None,
        overwrite: Overwrite = False,
        nproc: Nproc = 1,
    ) -> None:
        """Pretrain a model on token shards (or on the embedded default corpus)."""
        from euler.training.loop import TrainConfig

        tc = TrainConfig(
            out_dir=str(out), kind="pretrain", preset=preset, data=str(data) if data else None,
            device=device, tf32=tf32, exact_attention=exact_attention, cuda_graph=cuda_graph,
            batch_size=batch_size,
            seq_len=seq_len, grad_accum=grad_accum, steps=steps, tokens=tokens, lr=lr,
            min_lr=min_lr, warmup_steps=warmup,
            weight_decay=weight_decay, grad_clip=grad_clip, eval_every=eval_every,
            eval_batches=eval_batches, sample_tokens=sample_tokens, ckpt_every=ckpt_every,
            log_every=log_every, seed=seed,
        )  # fmt: skip
        _run(tc, resume, overwrite, nproc)

    @app.command("sft")
    def sft_command(
        from_: Annotated[
            Path | None,
            typer.Option("--from", help="Pretrained checkpoint (or run folder) to start from."),
        ] = None,
        data: Annotated[
            Path | None, typer.Option(help="Folder from `euler data prepare-sft`.")
        ] = None,
        out: Out = Path("runs/sft"),
        device: Device = "cpu",
        tf32: Tf32 = True,
        exact_attention: ExactAttention = False,
        cuda_graph: CudaGraph = True,
        batch_size: BatchSize = 8,
        grad_accum: GradAccum = 1,
        steps: Steps = 300,
        tokens: Tokens = 0,
        lr: Lr = 1e-3,
        min_lr: MinLr = 1e-4,
        warmup: Warmup = 20,
        weight_decay: WeightDecay = 0.1,
        grad_clip: GradClip = 1.0,
        eval_every: EvalEvery = 50,
        eval_batches: EvalBatches = 8,
        sample_tokens: SampleTokens = 40,
        ckpt_every: CkptEvery = 50,
        log_every: LogEvery = 10,
        seed: Seed = 0,
        resume: Resume = None,
        overwrite: Overwrite = False,
        nproc: Nproc = 1,
    ) -> None:
        """Fine-tune on instructions; the loss counts response tokens only."""
        from euler.training.loop import TrainConfig

        if resume is None and (from_ is None or data is None):
            raise EulerError("sft needs --from CHECKPOINT and --data SFT_FOLDER (or --resume)")
        tc = TrainConfig(
            out_dir=str(out), kind="sft", data=str(data) if data else None,
            init_from=str(from_) if from_ else None, device=device, tf32=tf32,
            exact_attention=exact_attention, cuda_graph=cuda_graph, batch_size=batch_size,
            grad_accum=grad_accum,
            steps=steps, tokens=tokens, lr=lr, min_lr=min_lr,
            warmup_steps=warmup, weight_decay=weight_decay, grad_clip=grad_clip,
            eval_every=eval_every, eval_batches=eval_batches, sample_tokens=sample_tokens,
            ckpt_every=ckpt_every, log_every=log_every, seed=seed,
        ) if resume is None else None  # fmt: skip
        _run(tc, resume, overwrite, nproc)

    @app.command("chat")
    def chat_command(
        checkpoint: Annotated[
            Path, typer.Option(help="Checkpoint file, or a run folder holding one.")
        ],
        prompt: Annotated[
            str | None, typer.Option(help="Answer this one instruction and exit (for scripts).")
        ] = None,
        max_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 96,
        temperature: Annotated[float, typer.Option(help="0: greedy.")] = 0.8,
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
    ) -> None:
        """Chat with a checkpoint: a REPL (/reset, Ctrl-D to quit) or one --prompt.

        --device cuda recomputes the whole context per step on the GPU (no KV cache there);
        the CPU decoder keeps a KV cache.

        Long prompts: the newest turns that fit in the context minus the room kept for the
        answer (min(max tokens, context/2)) are kept; a single prompt longer than that keeps
        its last tokens.
        """
        import numpy as np

        from euler.inference.generate import ChatSession
        from euler.inference.sampling import SamplingConfig
        from euler.training import checkpoint as ckpt

        if max_tokens < 1:
            raise EulerError("--max-tokens must be at least 1")
        sampling = SamplingConfig(0.0 if speculative else temperature, top_k, top_p)
        ck = ckpt.load(checkpoint)
        tok = ck.tokenizer()
        decoder = _decoder_factory(ck, device)
        session = ChatSession(decoder(), tok)
        rng = np.random.default_rng(seed)
        if prompt is not None:
            _answer(session, _check_text(prompt, "--prompt"), max_tokens, sampling, rng,
                    speculative, decoder)  # fmt: skip
            return
        print(f"chat with {ck.path} (step {ck.step}); /reset forgets the conversation, "
              "Ctrl-D quits", flush=True)  # fmt: skip
        while True:
            sys.stdout.write("you> ")
            sys.stdout.flush()
            try:
                line = sys.stdin.buffer.readline()
            except KeyboardInterrupt:
                print()
                return
            if not line:  # Ctrl-D / end of input
                print()
                return
            try:
                text = line.decode("utf-8").strip()
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

    @app.command("plot")
    def plot_command(
        runs: Annotated[
            list[Path],
            typer.Argument(help="Run folders holding metrics.jsonl (several: overlaid)."),
        ],
        out: Annotated[
            Path | None,
            typer.Option("--out", "-o", help="PNG path (default: the first RUN/loss.png)."),
        ] = None,
    ) -> None:
        """Write a PNG of the training and validation loss of a run, or of runs overlaid."""
        from euler.cli.plot import plot_runs

        path = plot_runs(runs, out or runs[0] / "loss.png")
        print(f"wrote {path}")


def _check_text(text: str, what: str) -> str:
    """Refuse text that is empty or not UTF-8 (undecodable argv bytes arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise EulerError(f"{what} is not valid UTF-8") from None
    if not text.strip():
        raise EulerError(f"{what} is empty")
    return text


def _decoder_factory(ck, device: str):
    """A function making fresh decoders of checkpoint ck on device: with a KV cache where
    the backend has one (the CPU's), else recomputing the context (the GPU's)."""
    if device not in ("cpu", "cuda"):
        raise EulerError(f"--device must be cpu or cuda, got {device!r}")
    from euler.inference.decode_device import make_decoder
    from euler.training.loop import make_backend

    backend = make_backend(device)
    return lambda: make_decoder(ck.cfg, ck.params, backend)


def _answer(session, text, max_tokens, sampling, rng, speculative, decoder) -> None:
    """Stream one answer to stdout, then a line of statistics; decoder() makes a decoder."""
    from euler.inference.generate import TextStream, generate, generate_speculative

    stream = TextStream(session.tok)
    sys.stdout.write("euler> ")

    def show(t: int) -> None:
        sys.stdout.write(stream.push(t))
        sys.stdout.flush()

    res, cut = session.reply(text, max_tokens, sampling, rng, speculative, show)
    sys.stdout.write(stream.flush() + "\n")
    if cut:
        print("(the prompt was longer than the context allows: only its last tokens were used)")
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
    print(line, flush=True)
