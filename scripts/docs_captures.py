"""Regenerate docs/'s pictures of the two chat front ends from one checkpoint:

    python scripts/docs_captures.py --checkpoint RUN [--out docs] [--repl-only]

- OUT/chat-repl.txt: `euler chat --checkpoint RUN` in a tmux pane (100 x 30): two
  messages typed, then the up arrow (readline's history brings the last message back),
  captured with `tmux capture-pane -p`. Needs tmux (a dev tool: apt-get install tmux).
- OUT/serve-chat.png: the chat page after two messages, by bench/serve_screenshot.py
  (headless chromium through Selenium).

The checkpoint is an SFT run, e.g. `euler pipeline --minutes 25 --out /tmp/pipe`'s
/tmp/pipe/runs/sft (docs/serve.md says which made the pictures in docs/).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = ("Give three tips for staying healthy.", "Describe a sunny day at the beach.")
PROMPT = "you>"  # as the pane shows it: capture-pane drops the space after it
TIMEOUT_S = 120


def tmux(*args: str) -> str:
    """Run a tmux command; its stdout (SystemExit with tmux's own line if it fails, as when
    the chat exited and took its session with it)."""
    done = subprocess.run(["tmux", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"tmux {args[0]}: {done.stderr.strip() or 'failed'} (did the chat exit?)")
    return done.stdout


def wait_for_prompts(session: str, n: int) -> str:
    """The pane's text once n of its lines start with the REPL's prompt (SystemExit after
    TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        text = tmux("capture-pane", "-p", "-t", session)
        if sum(line.startswith(PROMPT) for line in text.splitlines()) >= n:
            return text
        time.sleep(0.2)
    raise SystemExit(f"the chat showed fewer than {n} prompts in {TIMEOUT_S} s:\n{text}")


def capture_repl(checkpoint: Path, out: Path) -> None:
    """Write the REPL's pane after MESSAGES and an up arrow to `out` (text)."""
    if shutil.which("tmux") is None:
        raise SystemExit("tmux not found: apt-get install tmux")
    session = f"euler-docs-{id(out)}"
    # run beside the checkpoint so the banner names it by its own name, not a scratch path;
    # the temperature and seed make the capture repeat for the same checkpoint
    checkpoint = checkpoint.resolve()
    chat = shlex.join(
        [
            sys.executable,
            "-m",
            "euler.cli",
            "chat",
            "--checkpoint",
            checkpoint.name,
            "--temperature",
            "0.7",
            "--seed",
            "3",
            "--max-tokens",
            "48",
        ]
    )
    tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "30", "-c",
         str(checkpoint.parent), chat)  # fmt: skip
    try:
        for i, message in enumerate(MESSAGES):
            wait_for_prompts(session, i + 1)
            tmux("send-keys", "-t", session, message, "Enter")
        wait_for_prompts(session, len(MESSAGES) + 1)
        tmux("send-keys", "-t", session, "Up")
        time.sleep(0.5)
        text = tmux("capture-pane", "-p", "-t", session).rstrip() + "\n"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="Folder of the captures.")
    ap.add_argument("--repl-only", action="store_true", help="Only the tmux capture.")
    args = ap.parse_args()
    if not args.checkpoint.exists():
        raise SystemExit(f"--checkpoint {args.checkpoint}: not found")
    if not args.out.is_dir():
        raise SystemExit(f"--out {args.out}: not a folder")
    capture_repl(args.checkpoint, args.out / "chat-repl.txt")
    if not args.repl_only:
        png = args.out / "serve-chat.png"
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "bench" / "serve_screenshot.py"),
                "--checkpoint",
                str(args.checkpoint),
                "--out",
                str(png),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
