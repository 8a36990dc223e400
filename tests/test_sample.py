"""`euler sample`: plain continuations of a prompt, several samples, the sampling flags."""

from __future__ import annotations

import pytest

from euler.training.loop import train
from tests.train_helpers import build_data, run_cli, tiny_config

SEPARATOR = "-" * 40


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = build_data(tmp_path_factory)
    out = tmp_path_factory.mktemp("sample") / "pre"
    train(tiny_config(out, root / "pre", steps=4, sample_tokens=0))
    return out


def _samples(out: str) -> list[str]:
    parts = out.split(SEPARATOR + "\n")
    assert parts[-1] == "", out  # every sample closed by the separator
    return parts[:-1]


def test_greedy_samples_continue_the_prompt_and_agree(run, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "sample", "--checkpoint", str(run),
                             "--prompt", "The cat", "--num-samples", "2", "--max-tokens", "6",
                             "--temperature", "0")  # fmt: skip
    assert code == 0, err
    samples = _samples(out)
    assert len(samples) == 2 and samples[0] == samples[1]
    assert samples[0].startswith("The cat") and samples[0].endswith("\n")
    stats = [line for line in err.splitlines() if line.startswith("[sample ")]
    assert len(stats) == 2  # statistics on stderr only, one line a sample
    assert all(int(s.split()[2]) <= 6 for s in stats)
    assert "[sample" not in out


def test_seeds_give_different_samples_and_the_same_seed_the_same(run, monkeypatch, capsys):
    args = ("sample", "--checkpoint", str(run), "--num-samples", "3", "--max-tokens", "12",
            "--temperature", "1.5", "--top-k", "0", "--top-p", "1")  # fmt: skip
    code, out, err = run_cli(monkeypatch, capsys, *args, "--seed", "7")
    assert code == 0, err
    first = _samples(out)
    assert len(set(first)) > 1  # three draws at a high temperature differ
    code, again, _ = run_cli(monkeypatch, capsys, *args, "--seed", "7")
    assert _samples(again) == first


@pytest.mark.parametrize("cut", [("--top-k", "1"), ("--top-p", "1e-6")], ids=["top-k", "top-p"])
def test_top_k_1_and_a_tiny_top_p_sample_the_greedy_text(cut, run, monkeypatch, capsys):
    """Only the likeliest token survives either cut, so a hot temperature and any seed
    give the greedy continuation: the flags reach the sampler."""
    args = ("sample", "--checkpoint", str(run), "--prompt", "The cat", "--max-tokens", "12")
    greedy = _samples(run_cli(monkeypatch, capsys, *args, "--temperature", "0")[1])
    for seed in ("1", "2"):
        code, out, err = run_cli(monkeypatch, capsys, *args, "--temperature", "1.5",
                                 "--top-k", "0", "--top-p", "1", *cut, "--seed", seed)  # fmt: skip
        assert code == 0, err
        assert _samples(out) == greedy


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--num-samples", "0"), "--num-samples"),
        (("--max-tokens", "0"), "--max-tokens"),
        (("--temperature", "-1"), "--temperature"),
        (("--top-p", "0"), "--top-p"),
        (("--threads", "0"), "--threads"),
        (("--device", "tpu"), "--device"),
    ],
)
def test_bad_flags_are_one_line(run, monkeypatch, capsys, flags, named):
    code, out, err = run_cli(monkeypatch, capsys, "sample", "--checkpoint", str(run), *flags)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert named in err and out == ""
