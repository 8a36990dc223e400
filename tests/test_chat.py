"""`euler chat`: one-shot and REPL, speculative report, and bad input as one line, exit 2."""

from __future__ import annotations

import pytest

from euler.training.loop import train
from tests.train_helpers import build_data, run_cli, tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny pretrained-then-fine-tuned run folder."""
    root = build_data(tmp_path_factory)
    out = tmp_path_factory.mktemp("chat")
    train(tiny_config(out / "pre", root / "pre", steps=4, sample_tokens=0))
    train(tiny_config(out / "sft", root / "sft", kind="sft", init_from=str(out / "pre"),
                      steps=4, sample_tokens=0))  # fmt: skip
    return out / "sft"


def test_one_prompt_streams_an_answer(run, monkeypatch, capsys):
    """stdout holds the answer alone (for scripts); the prefix and statistics go to stderr."""
    args = ["--prompt", "Say dog twice.", "--max-tokens", "5", "--temperature", "0"]
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args)
    assert code == 0, err
    assert out.count("\n") == 1 and "euler> " not in out and "tok/s" not in out, out
    lines = err.splitlines()
    assert lines[0].startswith("euler> ") and "tok/s" in lines[-1], err


def test_a_prompt_is_answered_greedily_unless_told(run, monkeypatch, capsys):
    """--prompt decodes as euler eval does (temperature 0), whatever the seed; the REPL
    keeps sampling at DEFAULT_TEMPERATURE."""
    from euler.cli import commands_train

    base = ["chat", "--checkpoint", str(run), "--prompt", "Say dog twice.", "--max-tokens", "8"]
    answers = {run_cli(monkeypatch, capsys, *base, "--seed", str(s))[1] for s in range(3)}
    greedy = run_cli(monkeypatch, capsys, *base, "--temperature", "0")[1]
    assert answers == {greedy}
    seen = []
    real = commands_train._answer
    monkeypatch.setattr(commands_train, "_answer",
                        lambda session, text, n, sampling, *a: seen.append(sampling.temperature)
                        or real(session, text, n, sampling, *a))  # fmt: skip
    run_cli(monkeypatch, capsys, *base)
    run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), "--max-tokens", "2",
            stdin=b"hi\n")  # fmt: skip
    assert seen == [0.0, commands_train.DEFAULT_TEMPERATURE]


def test_speculative_reports_acceptance_and_speed_up(run, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), "--prompt",
                             "Say sun twice.", "--max-tokens", "12", "--speculative")  # fmt: skip
    assert code == 0, err
    assert "drafts accepted" in err and "tok/s plain greedy (best of 3)" in err
    assert "output identical" in err and "drafts" not in out


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "--prompt is empty"),
        ("  ", "--prompt is empty"),
        ("caf\udce9", "--prompt is not valid UTF-8"),
    ],  # fmt: skip
)
def test_bad_prompt_is_one_line(run, monkeypatch, capsys, prompt, message):
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), "--prompt",
                             prompt)  # fmt: skip
    assert code == 2 and err == f"error: {message}\n"


def test_repl_survives_bad_input_and_resets(run, monkeypatch, capsys):
    stdin = b"Say red twice.\n\xff\xfe oops\n\n   \n/reset\n/help\nSay sky twice.\n"
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run),
                             "--max-tokens", "4", stdin=stdin)  # fmt: skip
    assert code == 0, err  # end of input (Ctrl-D) ends the REPL cleanly
    assert out.count("euler> ") == 2  # two answers; the empty lines were skipped
    assert "error: that input is not UTF-8 (byte 0); type it again" in out
    assert "(conversation cleared)" in out and "commands: /reset" in out


def test_bad_checkpoints_are_one_line(run, monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(tmp_path))
    assert code == 2 and err.startswith("error: checkpoint not found") and err.count("\n") == 1
    bad = tmp_path / "checkpoint.safetensors"
    bad.write_bytes((run / "checkpoint.safetensors").read_bytes()[:5000])
    code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(bad), "--prompt", "x")
    assert code == 2 and "truncated" in err and err.count("\n") == 1


def test_device_cuda_gives_the_cpu_answer(run, monkeypatch, capsys):
    """--device cuda decodes through make_backend's backend (a CPU backend stands in here,
    with its KV cache): the same answer, speculative included; an unknown device is one line."""
    import euler.backend
    from euler.cpu.backend import CpuBackend

    args = ["--prompt", "Say dog twice.", "--max-tokens", "6", "--temperature", "0"]
    code, cpu_out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args)
    assert code == 0, err
    monkeypatch.setattr(euler.backend, "make_backend", lambda device, precision: CpuBackend())
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args,
                             "--device", "cuda", "--speculative")  # fmt: skip
    assert code == 0, err
    assert out == cpu_out and "output identical" in err
    code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args,
                           "--device", "tpu")  # fmt: skip
    assert code == 2 and err == "error: --device must be cpu or cuda, got 'tpu'\n"


def test_bf16_chat_on_cuda_decodes_in_bf16(run, monkeypatch, capsys):
    """--device cuda --precision bf16 runs the recompute decoder's forward on bf16 tensors
    (the CPU's emulation stands in for the GPU); its greedy answer starts as the fp32 one.
    The cpu's KV-cache decoder is fp32 only, and says so."""
    import euler.backend
    from euler.cpu.backend import CpuBackend
    from euler.inference import decode_device

    seen = []

    class Spy(decode_device.RecomputeDecoder):
        def __init__(self, cfg, params, backend, precision="fp32"):
            super().__init__(cfg, params, backend, precision)
            seen.append(self.model.acts is None and self.model.params_lp is not None)

    class NoCache(CpuBackend):  # as the GPU: no KV cache, so the recompute decoder
        kv_cache = False

    monkeypatch.setattr(decode_device, "RecomputeDecoder", Spy)
    monkeypatch.setattr(euler.backend, "make_backend", lambda device, precision: NoCache())
    args = ["--prompt", "Say dog twice.", "--max-tokens", "3", "--temperature", "0"]
    code, fp32_out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args)
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args,
                             "--device", "cuda", "--precision", "bf16")  # fmt: skip
    assert code == 0, err
    assert seen == [False, True]  # fp32, then a bf16 model with its weight copies
    assert out.splitlines()[0][:9] == fp32_out.splitlines()[0][:9]
    code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args,
                           "--precision", "bf16")  # fmt: skip
    assert code == 2 and err.startswith("error: --precision bf16: euler chat --device cpu takes")
    code, _, err = run_cli(monkeypatch, capsys, "chat", "--checkpoint", str(run), *args,
                           "--precision", "fp16")  # fmt: skip
    assert code == 2 and "fp32, tf32, bf16" in err


def _read_until(fd: int, want: bytes, seen: bytearray, timeout: float = 120.0) -> None:
    """Read the terminal's output into seen until `want` appears after what it held."""
    import os
    import select
    import time

    start, end = len(seen), time.monotonic() + timeout
    while want not in seen[start:]:
        left = end - time.monotonic()
        assert left > 0, f"no {want!r} in {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break


def test_the_repl_edits_lines_and_keeps_a_history_on_a_terminal(run):
    """On a terminal the REPL reads through readline: the up arrow brings the last line
    back (shown again after the prompt), never `^[[A` sent to the model."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    cmd = [sys.executable, "-c", "from euler.cli.main import main; main()", "chat",
           "--checkpoint", str(run), "--max-tokens", "2"]  # fmt: skip
    child = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                             env={**os.environ, "TERM": "xterm"})  # fmt: skip
    os.close(slave)
    seen = bytearray()
    try:
        _read_until(master, b"you> ", seen)
        os.write(master, b"Say sun twice.\r")
        _read_until(master, b"you> ", seen)
        mark = len(seen)
        os.write(master, b"\x1b[A\r")  # up arrow, Enter: the same line again
        _read_until(master, b"you> ", seen)
        again = bytes(seen[mark:])
        os.write(master, b"\x04")  # Ctrl-D
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
        os.close(master)
    assert b"^[[A" not in again and b"Say sun twice." in again, again
    assert again.count(b"euler> ") == 1, again
