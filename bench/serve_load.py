"""A load test of `euler serve`: 32 concurrent streaming clients, beside one client alone.

    python bench/serve_load.py --checkpoint RUN --json FILE [--device cuda]

Starts `euler serve` on 127.0.0.1 (a free port; --slots as many as the clients), then
1. alone: one client makes `--solo` streamed chat requests, one after another;
2. together: `--clients` threads, released at once, each making `--requests` streamed
   chat requests one after another (different instructions, sampled at temperature 0.8
   with a seed each, up to --max-tokens tokens; an answer may end sooner at <|end|>).
Each request is timed on the client: TTFT (sending to the first content chunk) and every
gap between content chunks after it (per-token latency: a chunk is a token's text, bar the
rare token that ends inside a UTF-8 character). Completion tokens come from the usage
chunk. Reported for both: requests, errors (every request must be answered: any error or
missing [DONE] is one), aggregate completion tokens/s over the wall time, and p50/p99 of
TTFT and per-token latency. Only loopback addresses are used; every request has a
timeout and the counts are fixed, so the run ends by itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

INSTRUCTIONS = [
    "Give three tips for staying healthy.", "Describe a sunny day at the beach.",
    "Write a short story about a lost dog.", "Explain why the sky is blue.",
    "Name some fruits that are red.", "What is a good way to learn to cook?",
    "Tell me about the moon.", "Write a poem about the sea.",
]  # fmt: skip
REQUEST_TIMEOUT_S = 300


def start_server(
    checkpoint: Path, slots: int, device: str = "cpu"
) -> tuple[subprocess.Popen, str, int]:
    """`euler serve` on a free loopback port: (process, host, port) once it listens."""
    cmd = [sys.executable, "-m", "euler.cli", "serve", "--checkpoint", str(checkpoint),
           "--port", "0", "--slots", str(slots), "--max-queue", str(slots),
           "--device", device]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = "no output"
    for line in proc.stdout:
        if line.startswith("serving "):
            address = line.split(" at http://")[1].split("/")[0]
            host, port = address.rsplit(":", 1)
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
            return proc, host, int(port)
    raise SystemExit(f"euler serve did not start (exit {proc.wait()}): {line.strip()}")


def stream_chat(host: str, port: int, instruction: str, max_tokens: int, seed: int) -> dict:
    """One streamed chat request: {"ttft", "gaps", "tokens", "error"} timed on the client."""
    body = {"messages": [{"role": "user", "content": instruction}], "max_tokens": max_tokens,
            "temperature": 0.8, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    out = {"ttft": None, "gaps": [], "tokens": 0, "error": None}
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        r = conn.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return out
        last, done = None, False
        for line in r:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = chunk["error"]["message"]
                break
            if chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                if last is None:
                    out["ttft"] = now - t0
                else:
                    out["gaps"].append(now - last)
                last = now
        if not done and out["error"] is None:
            out["error"] = "the stream ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def summarize(results: list[dict], wall: float) -> dict:
    """Counts, aggregate tokens/s and p50/p99 latencies (ms) of a phase's requests."""
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    pct = lambda xs, q: 1e3 * float(np.percentile(xs, q)) if xs else None  # noqa: E731
    return {"requests": len(results), "errors": sum(r["error"] is not None for r in results),
            "first_errors": [r["error"] for r in results if r["error"]][:3],
            "completion_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "token_ms_p50": pct(gaps, 50), "token_ms_p99": pct(gaps, 99)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="Checkpoint or run folder.")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3, help="Requests per concurrent client.")
    ap.add_argument("--solo", type=int, default=8, help="Requests of the client alone.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", type=Path, help="Write the results here.")
    args = ap.parse_args()
    proc, host, port = start_server(args.checkpoint, args.clients, args.device)
    try:
        stream_chat(host, port, INSTRUCTIONS[0], 4, 0)  # the first request's one-off costs
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        solo = [stream_chat(host, port, INSTRUCTIONS[i % len(INSTRUCTIONS)], args.max_tokens, i)
                for i in range(args.solo)]  # fmt: skip
        alone = summarize(solo, time.perf_counter() - t0)
        results: list[dict] = []
        gate = threading.Barrier(args.clients + 1)

        def client(c: int) -> None:
            gate.wait()
            for k in range(args.requests):
                seed = 1000 * c + k
                results.append(stream_chat(host, port, INSTRUCTIONS[(c + k) % len(INSTRUCTIONS)],
                                           args.max_tokens, seed))  # fmt: skip

        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        gate.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        together = summarize(results, time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"{'':>10} {'requests':>8} {'errors':>6} {'tokens':>7} {'tok/s':>7} {'TTFT p50':>9} "
          f"{'p99':>7} {'token p50':>9} {'p99':>7}  (ms)")  # fmt: skip

    def ms(v, width: int, digits: int) -> str:  # a latency, or "-" where no chunk came
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"

    for name, s in (("alone", alone), (f"{args.clients} at once", together)):
        print(f"{name:>10} {s['requests']:>8} {s['errors']:>6} {s['completion_tokens']:>7} "
              f"{s['tokens_per_s']:>7.0f} {ms(s['ttft_ms_p50'], 9, 1)} "
              f"{ms(s['ttft_ms_p99'], 7, 1)} {ms(s['token_ms_p50'], 9, 2)} "
              f"{ms(s['token_ms_p99'], 7, 2)}")  # fmt: skip
    print(f"load average before: {load:.2f} on {os.cpu_count()} cores")
    if args.json:
        record = {"what": f"euler serve load test, {args.device}",
                  "checkpoint": str(args.checkpoint),
                  "clients": args.clients, "requests_per_client": args.requests,
                  "max_tokens": args.max_tokens, "load_average_before": load,
                  "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                  "alone": alone, "together": together}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if alone["errors"] or together["errors"]:
        raise SystemExit("some requests failed: " + "; ".join(together["first_errors"]))


if __name__ == "__main__":
    main()
