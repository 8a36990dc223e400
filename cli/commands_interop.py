"""Interop commands: `euler export` and `euler import` (Hugging Face Llama folders, and
llama.cpp GGUF files on import)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from euler.errors import EulerError

FORMATS = ("hf", "gguf")
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="Foreign format: hf (Hugging Face LlamaForCausalLM folder) or gguf (llama.cpp "
        "file, import only).",
    ),
]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace what --out already holds.")]


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise EulerError(f"--format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")


def register(app: typer.Typer) -> None:
    """Attach `export` and `import` to the top-level app."""

    @app.command("export")
    def export_command(
        checkpoint: Annotated[
            Path, typer.Option(help="Checkpoint file, or a run folder holding one.")
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write.")],
        fmt: FormatOpt = "hf",
        overwrite: OverwriteOpt = False,
    ) -> None:
        """Write a checkpoint as a Hugging Face Llama folder.

        lm_head is MTP head 0; heads 1..K-1 go to mtp_heads.safetensors, so nothing is lost.
        """
        from euler.interop.hf_export import export_hf

        _check_format(fmt)
        if fmt != "hf":
            raise EulerError(f"--format {fmt}: export writes hf folders only")
        path = export_hf(checkpoint, out, overwrite)
        print(f"wrote {path}: config.json, model.safetensors, mtp_heads.safetensors, "
              "tokenizer.json, tokenizer_config.json, generation_config.json")  # fmt: skip

    @app.command("import")
    def import_command(
        src: Annotated[
            Path, typer.Argument(help="Hugging Face Llama folder, or a .gguf file (--format gguf).")
        ],
        out: Annotated[
            Path,
            typer.Option(
                "--out", "-o", help="Run folder to write (made if absent), or a .safetensors file."
            ),
        ],
        fmt: FormatOpt = "hf",
        tokenizer: Annotated[
            Path | None,
            typer.Option(help="Our tokenizer JSON, when SRC/tokenizer.json is not one of ours."),
        ] = None,
        n_mtp: Annotated[
            int | None,
            typer.Option(help="K heads when SRC has no mtp_heads.safetensors (default 1)."),
        ] = None,
        seed: Annotated[int, typer.Option(help="Seed of freshly initialised heads.")] = 0,
        context: Annotated[
            int | None,
            typer.Option(help="Context to run at (default: the model's trained context)."),
        ] = None,
        overwrite: OverwriteOpt = False,
    ) -> None:
        """Make a checkpoint from a Hugging Face Llama folder or a llama GGUF file that our
        config can express (tied embeddings and byte-level BPE tokenizers included)."""
        _check_format(fmt)
        if n_mtp is not None and n_mtp < 1:
            raise EulerError("--n-mtp must be at least 1")
        if context is not None and context < 1:
            raise EulerError("--context must be at least 1")
        if fmt == "gguf":
            from euler.interop.gguf_import import import_gguf

            if tokenizer is not None:
                raise EulerError("--tokenizer: a GGUF file carries its own tokenizer")
            path, cfg, notes = import_gguf(src, out, n_mtp, context, seed, overwrite)
        else:
            from euler.interop.hf_import import import_hf

            path, cfg, notes = import_hf(src, out, tokenizer, n_mtp, seed, overwrite, context)
        for note in notes:
            print(f"note: {note}")
        tied = ", tied embeddings" if cfg.tie_embeddings else ""
        print(f"wrote {path}: {cfg.n_params():,} parameters, {cfg.n_mtp} MTP heads{tied}, "
              f"context {cfg.context}")  # fmt: skip
