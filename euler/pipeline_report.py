"""The numbers of a finished pipeline, read back from what its commands wrote, and its
report.md: nanochat's report card (stages and their wall time, held-out bits per byte,
instruction metrics, sample answers, the loss curves, the machine, the versions, the
exact commands).

Every number comes from a file in the pipeline's folder: the data manifests, the runs'
metrics.jsonl, the eval reports; the report shows '-' for one that is missing.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
from pathlib import Path

from euler.data.files import atomic_open

SAMPLES = 3  # answers shown


def collect(folder: Path, p) -> dict:
    """The results of pipeline p (euler.pipeline.Pipeline) whose folder is `folder`."""
    folder = Path(folder)
    out: dict = {"machine": machine(p.settings.device), "versions": versions()}
    manifest = _json(folder / "data/pretrain/manifest.json")
    if manifest:
        totals = manifest.get("totals", {})
        out["data"] = {
            "vocab_size": manifest.get("tokenizer", {}).get("vocab_size"),
            "train_tokens": totals.get("tokens", {}).get("train"),
            "val_tokens": totals.get("tokens", {}).get("val"),
            "bytes_per_token": totals.get("bytes_per_token"),
            "documents": sum(
                sum(src.get("documents", {}).values()) for src in manifest.get("sources", [])
            ),
        }
    sft = _json(folder / "data/sft/manifest.json")
    if sft:
        train = sft.get("splits", {}).get("train", {})
        out["sft_data"] = {
            "records": train.get("records"),
            "kept": train.get("kept"),
            "windows": train.get("windows"),
            "context": sft.get("context"),
        }
    for name in ("pretrain", "sft"):
        run = run_numbers(folder / "runs" / name)
        if run:
            out[name] = run
    text = _json(folder / "eval-text.json").get("text")
    if text:
        out["eval_text"] = {"overall": text["overall"], "sources": text["sources"]}
    instr = _json(folder / "eval-instructions.json").get("instructions")
    if instr:
        keep = (
            "records",
            "max_tokens",
            "ended_share",
            "mean_tokens",
            "loop_share",
            "reference_loop_share",
            "rouge_l",
            "rouge_l_budget",
            "end_token",
        )
        out["eval_instructions"] = {k: instr.get(k) for k in keep}
        out["samples"] = [
            {k: a[k] for k in ("instruction", "input", "answer", "reference", "ended")}
            for a in instr.get("answers", [])[:SAMPLES]
        ]
    out["plots"] = [
        name for name in ("loss-pretrain.png", "loss-sft.png") if (folder / name).is_file()
    ]
    return out


def run_numbers(run: Path) -> dict:
    """A run's steps, tokens, speed and last validation losses, from its metrics.jsonl."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return {}
    steps, vals = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a last line cut short
            continue
        if "val_loss" in rec:
            vals.append(rec)
        elif "loss" in rec:
            steps.append(rec)
    if not steps:
        return {}
    speeds = [r["tok_s"] for r in steps[1:] if r.get("tok_s")]  # the first step compiles
    last = vals[-1] if vals else {}
    heads = last.get("val_loss_heads") or [None]
    return {
        "steps": steps[-1]["step"],
        "tokens": steps[-1].get("tokens"),
        "train_loss": steps[-1].get("loss"),
        "val_loss_next_token": heads[0],
        "val_loss_mean_heads": last.get("val_loss"),
        "tokens_per_second_median": statistics.median(speeds) if speeds else None,
    }


def machine(device: str) -> dict:
    """The machine: CPU model and cores, OS, and the GPU when the device is cuda."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "host": platform.node()}
    if device == "cuda":
        try:
            from numba import cuda

            info["gpu"] = cuda.get_current_device().name.decode()
        except Exception as e:  # the pipeline ran there; a name is all this is for
            info["gpu"] = f"unknown ({type(e).__name__})"
    return info


def versions() -> dict:
    """Versions of Python, the package, its compilers and numpy, and the git commit."""
    from importlib.metadata import PackageNotFoundError, version

    from euler.bench.steps import git_commit

    out = {"python": platform.python_version()}
    for pkg in ("nanoeuler", "numba", "llvmlite", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    out["git"] = git_commit()
    return out


def _json(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


# ---------------------------------------------------------------------------- report.md


def _num(x, fmt: str = "{:,.4f}") -> str:
    from euler.pipeline import finite

    return fmt.format(x) if finite(x) else "-"


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s"


def write_report(path: Path, doc: dict) -> None:
    """Write report.md of pipeline.json's contents `doc`, atomically."""
    with atomic_open(path, "w") as f:
        f.write(render(doc))


def render(doc: dict) -> str:
    """report.md's text."""
    s, r = doc["settings"], doc["results"]
    lines = [
        "# NanoEuler pipeline report",
        "",
        f"`euler pipeline` on {s['device']}: preset `{s['preset']}`, raw data "
        f"`{s['raw']}`, {_clock(doc['total_seconds'])} in all"
        + (f" (budget {s['minutes']:g} min)." if s.get("minutes") is not None else "."),
        "",
        "## Summary",
        "",
        "| | |",
        "|---|---|",
    ]
    pre, sft = r.get("pretrain", {}), r.get("sft", {})
    text, instr = r.get("eval_text", {}), r.get("eval_instructions", {})
    lines += [
        f"| held-out bits per byte (pretrained, head 0) | "
        f"{_num(text.get('overall', {}).get('bits_per_byte'))} |",
        f"| pretraining val loss, next token (mean of heads) | "
        f"{_num(pre.get('val_loss_next_token'))} ({_num(pre.get('val_loss_mean_heads'))}) |",
        f"| SFT val loss, next token (mean of heads) | "
        f"{_num(sft.get('val_loss_next_token'))} ({_num(sft.get('val_loss_mean_heads'))}) |",
        f"| held-out answers that end | {_num(instr.get('ended_share'), '{:.1%}')} |",
        f"| ROUGE-L F1 of the answers | {_num(instr.get('rouge_l'))} |",
        "",
        "## Stages",
        "",
        "| stage | wall time | budget | |",
        "|---|---|---|---|",
    ]
    for st in doc["stages"]:
        budget = _clock(st["budget_seconds"]) if st["budget_seconds"] is not None else ""
        note = f"skipped: {st['skipped']}" if st["skipped"] else ""
        lines.append(f"| {st['name']} | {_clock(st['seconds'])} | {budget} | {note} |")
    if "calibration_tokens_per_second" in r:
        lines += [
            "",
            f"Pretraining tokens, SFT steps and the held-out tokens scored fit the budget at "
            f"{r['calibration_tokens_per_second']:,.0f} tokens/s, measured on "
            "3 training steps before pretraining.",
        ]
    lines += _data(r) + _training(pre, sft) + _text(text) + _instructions(instr, r)
    lines += ["", "## Loss curves", ""]
    plot_stage = [st for st in doc["stages"] if st["name"] == "plot"]
    if r.get("plots"):
        lines += [f"![{name}]({name})" for name in r["plots"]]
    else:
        why = plot_stage[0]["skipped"] if plot_stage else "no plot stage ran"
        lines.append(f"No plot: {why}.")
    lines += ["", "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in r.get("machine", {}).items()]
    lines += ["", "## Versions", ""]
    lines += [f"- {k}: {v}" for k, v in r.get("versions", {}).items()]
    lines += ["", "## Commands", "", "Run inside this folder, in this order:", "", "```bash"]
    for st in doc["stages"]:
        for argv in st["commands"]:
            skipped = "# skipped: " if st["skipped"] else ""
            lines.append(skipped + shlex.join(["euler", *argv]))
    lines += ["```", ""]
    return "\n".join(lines)


def _data(r: dict) -> list[str]:
    d, sd = r.get("data", {}), r.get("sft_data", {})
    return [
        "",
        "## Data",
        "",
        f"- pretraining: {_num(d.get('documents'), '{:,}')} documents, "
        f"{_num(d.get('train_tokens'), '{:,}')} train and {_num(d.get('val_tokens'), '{:,}')} "
        f"held-out tokens; a {_num(d.get('vocab_size'), '{:,}')}-token tokenizer, "
        f"{_num(d.get('bytes_per_token'), '{:.3f}')} bytes per token",
        f"- instructions: {_num(sd.get('kept'), '{:,}')} of {_num(sd.get('records'), '{:,}')} "
        f"train records kept at context {_num(sd.get('context'), '{:,}')}, in "
        f"{_num(sd.get('windows'), '{:,}')} windows",
    ]


def _training(pre: dict, sft: dict) -> list[str]:
    lines = [
        "",
        "## Training",
        "",
        "| run | steps | tokens | train loss (mean of heads) | val loss, next token | "
        "val loss, mean of heads | tokens/s (median step) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in (("pretrain", pre), ("sft", sft)):
        lines.append(
            f"| {name} | {_num(run.get('steps'), '{:,}')} | {_num(run.get('tokens'), '{:,}')} | "
            f"{_num(run.get('train_loss'))} | {_num(run.get('val_loss_next_token'))} | "
            f"{_num(run.get('val_loss_mean_heads'))} | "
            f"{_num(run.get('tokens_per_second_median'), '{:,.0f}')} |"
        )
    return lines


def _text(text: dict) -> list[str]:
    lines = [
        "",
        "## Held-out text",
        "",
        "Bits per byte of the pretrained model on the held-out split (head 0):",
        "",
        "| source | documents | tokens | bits/byte |",
        "|---|---|---|---|",
    ]
    for row in [*text.get("sources", []), text.get("overall", {})]:
        if row:
            lines.append(
                f"| {row['source']} | {row['documents']:,} | {row['tokens']:,} | "
                f"{_num(row['bits_per_byte'])} |"
            )
    return lines


def _instructions(instr: dict, r: dict) -> list[str]:
    m = instr.get("max_tokens")
    lines = [
        "",
        "## Instructions",
        "",
        f"Greedy answers of the fine-tuned model to {_num(instr.get('records'), '{:,}')} "
        f"held-out instructions, at most {m} tokens:",
        "",
        "| metric | value |",
        "|---|---|",
        f"| answers that end with `{instr.get('end_token')}` | "
        f"{_num(instr.get('ended_share'), '{:.1%}')} |",
        f"| mean tokens of an answer | {_num(instr.get('mean_tokens'), '{:.1f}')} |",
        f"| answers that loop | {_num(instr.get('loop_share'), '{:.1%}')} |",
        f"| ROUGE-L F1, whole references | {_num(instr.get('rouge_l'))} |",
        f"| ROUGE-L F1, references' first {m} tokens | {_num(instr.get('rouge_l_budget'))} |",
        "",
        "## Sample answers",
        "",
    ]
    for a in r.get("samples", []):
        prompt = a["instruction"] + (f"\n{a['input']}" if a["input"] else "")
        lines += [f"> {line}" for line in prompt.splitlines()]
        lines += [
            "",
            "```text",
            a["answer"] + ("" if a["ended"] else " [...]"),
            "```",
            f"Reference: {a['reference'][:300]}",
            "",
        ]
    return lines
