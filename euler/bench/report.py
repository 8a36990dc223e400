"""`euler bench`'s rich tables: a BenchResult (euler.bench.steps) rendered for people.

Ratios compare each engine's tokens/s with the PyTorch peer's eager figure (above 1: faster
than eager PyTorch). Times are milliseconds; memory is MiB. Every title names the run's
--precision, and the step table each engine's (the peer's bf16 is autocast).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from euler.bench.steps import BenchResult

PEER = "torch_eager"  # the engine every ratio divides by


def step_table(res: BenchResult) -> Table:
    """One row per engine: its precision, tokens/s, ms/step, MFU, peak memory (with the
    process's memory as the engine started, which that peak includes), the ratio to the
    peer, the first step's seconds (compilation), the host's milliseconds until a step's work
    was issued (on a GPU, Python's share; `ours` launches every kernel there,
    `ours_cuda_graph` replays graphs), CPU seconds per wall second over the timed steps
    (below the thread count: other processes had the cores) and the last loss (same weights,
    batch and steps: the engines' losses agree, to bf16's rounding under bf16)."""
    m = res.meta
    title = (
        f"training step: {m['preset']} ({m['params']:,} params), B={m['batch']} T={m['seq']}, "
        f"{m.get('gpu', m['device'])}, {m['precision']}"
    )
    if m["device"] == "cpu":
        title += f", {m['numba_threads']} threads (each engine)"
        if m.get("openblas_kernels"):
            title += f", OpenBLAS {m['openblas_kernels']} kernels"
    t = Table(title=title)
    cols = ("engine", "precision", "tokens/s", "ms/step", "MFU", "peak MiB (start)")
    cols += ("vs torch eager", "1st s", "host ms", "cpu/wall", "last loss")
    for col in cols:
        t.add_column(col, justify="left" if col == "engine" else "right")
    base = res.step.get(PEER, {}).get("tokens_per_s")
    for name, s in res.step.items():
        if "skipped" in s:
            t.add_row(name, "skipped", *[""] * (len(cols) - 2))
            continue
        ratio = f"{s['tokens_per_s'] / base:.2f}x" if base else "-"
        t.add_row(
            name,
            s["precision"],
            f"{s['tokens_per_s']:,.0f}",
            f"{s['ms_per_step']:.1f}",
            f"{100 * s['mfu']:.1f}%",
            f"{s['peak_memory_mib']:.0f}"
            + (f" ({s['rss_at_start_mib']:.0f})" if s.get("rss_at_start_mib") else ""),
            ratio,
            f"{s['first_step_s']:.1f}",
            f"{s['host_ms_per_step']:.1f}" if "host_ms_per_step" in s else "-",
            f"{s['cpu_s_per_wall_s']:.2f}",
            f"{s['loss_last']:.4f}",
        )
    return t


def layer_table(res: BenchResult) -> Table:
    """Forward and backward ms of each layer kernel alone, at the step's shapes and dtypes;
    a case that is neither (the fused cross-entropy, AdamW's step) has a row of its own, its
    time under backward."""
    reps = res.meta["options"]["reps"]
    t = Table(title=f"layer kernels alone, {res.meta['precision']}, best of {reps} (ms)")
    for col in ("layer", "forward", "backward"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    rows: dict[str, list[str]] = {}
    for name, ms in res.layers.items():
        if name.endswith("_forward_backward"):
            rows[name.removesuffix("_forward_backward") + " (fused)"] = ["", f"{ms:.3f}"]
            continue
        base, _, pass_ = name.rpartition("_")
        if pass_ not in ("forward", "backward"):
            rows[name] = ["", f"{ms:.3f}"]
            continue
        rows.setdefault(base, ["", ""])[pass_ == "backward"] = f"{ms:.3f}"
    for base, (fwd, bwd) in rows.items():
        t.add_row(base, fwd, bwd)
    return t


def attention_table(res: BenchResult) -> Table:
    """Our attention against naive attention (materialised scores) at each length.

    Ours is FlashAttention, except on the CPU up to T = 256, where the backend computes dense
    score blocks (euler/cpu/attention_dense.py); the JSON keys keep the name flash_*.
    """
    naive = "cuBLAS" if res.meta.get("device") == "cuda" else "NumPy"
    ours = res.meta["precision"]
    t = Table(title=f"attention: ours ({ours}) vs naive {naive} (scores materialised), ms")
    cols = ("B x T", "ours fwd", "ours bwd", "naive fwd", "naive bwd", "naive/ours", "max|diff|")
    for col in cols:
        t.add_column(col, justify="right")
    for a in res.attention:
        t.add_row(
            f"{a['B']} x {a['T']}",
            f"{a['flash_fwd_ms']:.2f}",
            f"{a['flash_bwd_ms']:.2f}",
            f"{a['naive_fwd_ms']:.2f}",
            f"{a['naive_bwd_ms']:.2f}",
            f"{a['naive_over_flash']:.2f}x",
            f"{a['max_abs_diff_out']:.1e}",
        )
    return t


def print_report(res: BenchResult, console: Console | None = None) -> None:
    """The three tables, the MFU formula with its peak, the tokenizer line and the notes."""
    console = console or Console()
    console.print(step_table(res))
    p = res.peak
    console.print(
        f"{p['mfu_formula']}; params = {res.meta['params']:,}, "
        f"peak = {p['gflop_per_s']:,.1f} GFLOP/s ({p['source']})"
    )
    load = res.meta["loadavg_before"][0], res.meta["loadavg_after"][0]
    console.print(
        f"load average {load[0]:.2f} before, {load[1]:.2f} after, on {res.meta['cpu_count']} "
        "cores (above the core count: other processes shared them)"
    )
    console.print(layer_table(res))
    console.print(attention_table(res))
    tok = res.tokenizer
    if "skipped" in tok:
        console.print(f"tokenizer: skipped ({tok['skipped']})")
    else:
        speeds = ", ".join(
            f"{v:.1f} MB/s on {k.split('_')[4]} thread(s)"
            for k, v in tok.items()
            if k.startswith("encode_mb_per_s")
        )
        console.print(
            f"tokenizer encode ({tok['text']}, {tok['mb']:.2f} MB, vocab {tok['vocab_size']} "
            f"trained here in {tok['train_s']:.1f} s): {speeds}"
        )
    for note in res.notes:
        console.print(f"note: {note}")
