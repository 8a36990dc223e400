"""`euler train --config FILE` and `euler sft --config FILE`: a TOML or JSON file of run.json's
settings (or a run's run.json), flags beside it winning, and its bad values one line naming
the file and the field or flag, before any folder is made."""

from __future__ import annotations

import json

import pytest

from euler.training import checkpoint
from euler.training.run_folder import read_run
from tests.train_helpers import one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder

RUN = ["--eval-every", "1", "--eval-batches", "1", "--sample-tokens", "2", "--steps", "1"]


def test_a_toml_file_sets_the_run_and_a_flag_beside_it_wins(
    data_root, tmp_path, monkeypatch, capsys
):
    toml = tmp_path / "model.toml"
    toml.write_text(
        f'preset = "tiny"\nn_layer = 1\nd_model = 24\nn_head = 3\nn_kv_head = 1\n'
        f'context = 16\nbatch_size = 2\nlr = 5e-3\nwarmup_steps = 1\ndata = "{data_root}/pre"\n'
    )
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(toml), "--out",
                           str(run), "--lr", "4e-3", *RUN)  # fmt: skip
    assert code == 0, err
    tc, cfg = read_run(run)
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.context) == (1, 24, 3, 1, 16)
    assert (tc.batch_size, tc.warmup_steps, tc.lr) == (2, 1, 4e-3)  # --lr over the file's
    assert tc.data == f"{data_root}/pre" and checkpoint.load(run).cfg == cfg


def test_a_runs_run_json_starts_another_run_like_it(data_root, tmp_path, monkeypatch, capsys):
    """Pretraining and SFT both: every setting the same but the flags given."""
    first = tmp_path / "first"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--batch-size", "2",
                           "--n-layer", "1", "--data", str(data_root / "pre"),
                           "--out", str(first), "--warmup-steps", "1", *RUN)  # fmt: skip
    assert code == 0, err
    second = tmp_path / "second"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(first / "run.json"),
                           "--out", str(second), "--seed", "1")  # fmt: skip
    assert code == 0, err
    (a, cfg_a), (b, cfg_b) = read_run(first), read_run(second)
    assert cfg_a == cfg_b and (b.seed, b.out_dir) == (1, str(second))
    assert {**a.to_dict(), "seed": 1, "out_dir": str(second)} == b.to_dict()
    sft = tmp_path / "sft"
    code, _, err = run_cli(monkeypatch, capsys, "sft", "--checkpoint", str(first), "--data",
                           str(data_root / "sft"), "--out", str(sft), "--warmup-steps", "1",
                           *RUN)  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, "sft", "--config", str(sft / "run.json"),
                           "--out", str(tmp_path / "sft2"))  # fmt: skip
    assert code == 0, err
    assert {**read_run(sft)[0].to_dict(), "out_dir": str(tmp_path / "sft2")} == (
        read_run(tmp_path / "sft2")[0].to_dict()
    )


@pytest.mark.parametrize(
    "name, text, named",
    [
        ("c.toml", "n_layers = 2\n", "c.toml: n_layers: unknown field"),
        ("c.toml", 'lr = "fast"\n', "lr: expected a finite number, found the string 'fast'"),
        ("c.json", '{"n_layer": -1}', "--n-layer must be an integer in [0,"),
        ("c.json", '{"kind": "sft"}', "c.json: kind: expected 'pretrain' (euler train does not"),
        ("c.json", '{"beta1": 0.5}', "c.json: beta1: expected 0.9"),
        ("c.json", "[1]", "c.json: expected a JSON object, found a list of 1"),
        ("c.toml", "lr = \n", "c.toml: invalid TOML (Invalid value (at line 1, column 6))"),
        ("c.json", '{"lr": 1e-3,}', "c.json:1: invalid JSON"),
        ("c.yaml", "lr: 1e-3\n", "--config c.yaml: expected a .toml or .json file"),
        ("missing.toml", None, "missing.toml: config file not found"),
    ],
)
def test_bad_config_files_are_one_line(tmp_path, monkeypatch, capsys, name, text, named):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / name).write_text(text)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--config", name,
                           "--out", "r")  # fmt: skip
    one_line_error(code, err, named)
    assert not (tmp_path / "r").exists()


def test_an_impossible_size_names_the_file_and_the_flag(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.json").write_text(json.dumps({"preset": "tiny", "d_model": 25}))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(tmp_path / "c.json"),
                           "--n-head", "4", "--out", str(tmp_path / "r"))  # fmt: skip
    one_line_error(code, err, f"--config {tmp_path / 'c.json'} with the flags given: "
                    "--d-model (25) must be divisible by n_head")  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_config_is_refused_with_resume_and_sft_still_needs_its_inputs(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "c.json").write_text("{}")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(tmp_path / "c.json"),
                           "--resume", str(tmp_path))  # fmt: skip
    one_line_error(code, err, "--config starts a run, --resume continues one")
    code, _, err = run_cli(monkeypatch, capsys, "sft", "--config", str(tmp_path / "c.json"),
                           "--out", str(tmp_path / "r"))  # fmt: skip
    one_line_error(code, err, "sft needs --checkpoint CHECKPOINT and --data SFT_FOLDER")
