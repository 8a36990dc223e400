"""GpuOptions, the one object that says what a GPU backend does, and its place in run.json."""

from __future__ import annotations

import json

import pytest

from euler.errors import EulerError
from euler.model.config import ModelConfig
from euler.training import run_folder
from euler.training.config import TrainConfig
from euler.training.run_folder import RunInfo

pytest.importorskip("numba.cuda")
from euler.gpu.options import GpuOptions  # noqa: E402


def test_options_refuse_bad_fields_and_feed_the_tensor_core_attention() -> None:
    """Each bad field is named; tc_options carries the prep fields into TcOptions."""
    for field, bad in (("threads", 48), ("tile", -1), ("gemm_candidates", 0)):
        with pytest.raises(ValueError, match=f"GpuOptions.{field}"):
            GpuOptions(**{field: bad})
    tc = GpuOptions(tc_prep_span=3).tc_options(64, bf16=True)
    assert (tc.head_size, tc.prep_span, tc.bf16) == (64, 3, True)
    from euler.gpu.attention_tc import TcOptions

    # the defaults are the launchers' own: the same compiled kernels (TcOptions is their key)
    assert GpuOptions().tc_options(64, bf16=False) == TcOptions(64)


def _info(backend: dict | None) -> RunInfo:
    return RunInfo("abc123", TrainConfig(), ModelConfig(), None, backend)


def test_run_json_keeps_the_backend_and_reads_runs_without_one(tmp_path) -> None:
    """run.json holds the backend's settings; one written before them reads as None; a
    value that is not a scalar is refused, naming the field."""
    settings = {"tf32": True, "threads": 256, "device": "NVIDIA H200", "multiprocessors": 132}
    run_folder.write_run_files(tmp_path, _info(settings))
    assert run_folder.read_run_info(tmp_path).backend == settings
    run_folder.write_run_files(tmp_path, _info(None))
    doc = json.loads((tmp_path / run_folder.RUN_FILE).read_text())
    assert "backend" not in doc and run_folder.read_run_info(tmp_path).backend is None
    doc["backend"] = {"tile": [4]}
    (tmp_path / run_folder.RUN_FILE).write_text(json.dumps(doc))
    with pytest.raises(EulerError, match="backend.tile: expected a number, boolean or string"):
        run_folder.read_run_info(tmp_path)
