"""`euler sample`: plain continuations of a prompt, without the chat template (nanoGPT's
sample.py): the model sees the prompt as the start of a document."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from euler.cli.options import DecodeThreads

from euler.errors import EulerError

SEPARATOR = "-" * 40


def register(app: typer.Typer) -> None:
    """Add the sample command to the app."""

    @app.command("sample")
    def sample_command(
        checkpoint: Annotated[
            Path, typer.Option(help="Checkpoint file, or a run folder holding one.")
        ],
        prompt: Annotated[str, typer.Option(help="Text to continue (may be empty).")] = "",
        num_samples: Annotated[int, typer.Option(help="Continuations to draw.")] = 3,
        max_tokens: Annotated[int, typer.Option(help="Most new tokens per sample.")] = 100,
        temperature: Annotated[float, typer.Option(help="0: greedy.")] = 0.8,
        top_k: Annotated[int, typer.Option(help="Keep the k likeliest tokens (0: all).")] = 40,
        top_p: Annotated[float, typer.Option(help="Keep the smallest set of mass p.")] = 0.95,
        seed: Annotated[int, typer.Option(help="Seed of the first sample's draws.")] = 0,
        device: Annotated[str, typer.Option(help="cpu, or cuda (needs the gpu extra).")] = "cpu",
        threads: DecodeThreads = None,
    ) -> None:
        """Continue --prompt --num-samples times (no chat template; a sample ends at the
        end-of-document token or after --max-tokens). Samples go to stdout, separated by a
        line of dashes; statistics to stderr."""
        import numpy as np
        from euler.cli.commands_train import _decoder_factory

        from euler.inference.generate import TextStream, generate
        from euler.inference.sampling import SamplingConfig
        from euler.threads import pick_threads
        from euler.training import checkpoint as ckpt
        from euler.training.config import check_int

        check_int(num_samples, "--num-samples", 1, 10_000)
        check_int(max_tokens, "--max-tokens", 1, 1 << 20)
        check_int(seed, "--seed", 0, 2**63 - 1)
        sampling = SamplingConfig(temperature, top_k, top_p)
        if device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {device!r}")
        n_threads = pick_threads(threads) if threads is not None else 1
        ck = ckpt.load(checkpoint)
        tok = ck.tokenizer()
        ids = [tok.eot_id, *tok.encode(prompt).tolist()]  # a document starts after <eot>
        if len(ids) >= ck.cfg.context:
            raise EulerError(f"--prompt: {len(ids) - 1} tokens leave no room in the model's "
                             f"context of {ck.cfg.context}")  # fmt: skip
        make = _decoder_factory(ck, device, "fp32", n_threads)
        for i in range(num_samples):
            stream = TextStream(tok)
            sys.stdout.write(prompt)

            def show(t: int, stream=stream) -> None:
                sys.stdout.write(stream.push(t))
                sys.stdout.flush()

            res = generate(make(), ids, max_tokens, sampling, np.random.default_rng(seed + i),
                           stop_ids=(tok.eot_id,), on_token=show)  # fmt: skip
            sys.stdout.write(stream.flush() + "\n" + SEPARATOR + "\n")
            sys.stdout.flush()
            print(f"[sample {i + 1}: {len(res.tokens)} tokens, {res.tokens_per_second:.1f} "
                  f"tok/s, ended by {res.stop}]", file=sys.stderr)  # fmt: skip
