"""`euler serve`: the OpenAI-compatible API and the chat page (euler/serve/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from euler.cli.options import DecodeThreads

from euler.errors import EulerError
from euler.precision import precision_help, resolve_precision
from euler.training.config import check_int


def register(app: typer.Typer) -> None:
    """Add the serve command to the app."""

    @app.command("serve")
    def serve_command(
        checkpoint: Annotated[
            Path, typer.Option(help="Checkpoint file, or a run folder holding one.")
        ],
        host: Annotated[
            str, typer.Option(help="Address to listen on; other than loopback, set --api-key.")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port (0: any free one, printed).")] = 8000,
        device: Annotated[
            str, typer.Option(help="cpu, or cuda (needs the gpu extra and a GPU).")
        ] = "cpu",
        precision: Annotated[str | None, typer.Option(help=precision_help("serve"))] = None,
        api_key: Annotated[
            str | None,
            typer.Option(
                envvar="EULER_API_KEY",
                show_default=False,
                help="Require 'Authorization: Bearer KEY' on every /v1 request.",
            ),
        ] = None,  # fmt: skip
        model_name: Annotated[
            str | None, typer.Option(help="The model's id in the API (default: the run's name).")
        ] = None,
        slots: Annotated[
            int, typer.Option(help="Requests decoded together, one token each a step.")
        ] = 8,
        max_queue: Annotated[
            int, typer.Option(help="Requests that may wait for a slot (more: 503 busy).")
        ] = 64,
        max_tokens: Annotated[
            int | None, typer.Option(help="Most completion tokens a request may ask for.")
        ] = None,
        prefill_chunk: Annotated[
            int,
            typer.Option(
                help="Prompt tokens a request feeds a step, so that a long prompt "
                "delays the other streams by at most that (0: whole prompts)."
            ),
        ] = 64,  # fmt: skip
        debug: Annotated[
            bool, typer.Option(help="Print a server fault's traceback (else one line).")
        ] = False,
        quiet: Annotated[
            bool,
            typer.Option(
                help="No access log (else one line a request: method, path, status, "
                "completion tokens, milliseconds)."
            ),
        ] = False,
        threads: DecodeThreads = None,
    ) -> None:
        """Serve a checkpoint over HTTP: an OpenAI-compatible API (/v1/chat/completions,
        /v1/completions, /v1/models), /health, and a chat page at /. Needs the serve extra
        (pip install -e '.\\[serve]')."""  # \\[: Rich would read [serve] as markup
        from euler.serve.protocol import Limits, ServeConfig
        from euler.serve.run import is_loopback, model_id, serve
        from euler.threads import pick_threads

        check_int(port, "--port", 0, 65535)
        check_int(slots, "--slots", 1, 1024)
        check_int(max_queue, "--max-queue", 0, 1 << 20)
        check_int(prefill_chunk, "--prefill-chunk", 0, 1 << 20)
        if max_tokens is not None:
            check_int(max_tokens, "--max-tokens", 1, 1 << 20)
        if device not in ("cpu", "cuda"):
            raise EulerError(f"--device must be cpu or cuda, got {device!r}")
        resolve_precision(device, precision, "serve")  # fp32 only: the batch decoder's
        if api_key is not None and not api_key.strip():
            raise EulerError("--api-key is empty")
        if model_name is not None and not model_name.strip():
            raise EulerError("--model-name is empty")
        name = model_name or model_id(checkpoint)
        cfg = ServeConfig(
            name, api_key, slots, max_queue, prefill_chunk, Limits(max_tokens=max_tokens), debug,
            pick_threads(threads) if threads is not None else 1, access_log=not quiet,
        )  # fmt: skip
        if not is_loopback(host) and api_key is None:
            print(f"warning: --host {host} is reachable from other machines and no --api-key "
                  "is set: anyone who can reach it can use the model", flush=True)  # fmt: skip
        serve(checkpoint, host, port, device, cfg, lambda line: print(line, flush=True))
