"""Data parallelism: N ranks train exactly as one process on the combined batch.

In-process (no MPI needed): shard_batch's head weights make the mean of the ranks'
gradients the global batch's gradient, SFT masks included. Under mpiexec (skipped without
mpi4py and mpiexec): 2 CPU ranks against single-process training, for `euler train --nproc`,
for a run resumed on 2 ranks from a 1-process checkpoint, and for SFT started under mpiexec
directly; losses equal to 1e-6. NCCL: a missing library is one EulerError; with the wheel,
the CPU-side calls (version, unique id), the header's constants and the file rendezvous;
the GPU collectives are marked `gpu`. Each rank runs 1 Numba and 1 BLAS thread.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from euler.errors import EulerError
from euler.gpu import nccl
from euler.model.config import get_preset
from euler.model.transformer import Model, make_targets
from euler.training import checkpoint, distributed
from euler.training import loop as train_mod
from euler.training.loop import train
from tests.train_helpers import read_metrics, tiny_config

pytestmark = pytest.mark.usefixtures("own_cache")  # EULER_CACHE in each test's folder

REPO = Path(__file__).resolve().parents[1]
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec (the dist extra)")
TOL = 1e-6  # 2 ranks vs 1 process: float32 sums in another order, nothing else


def _losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run) if "loss" in r]


def _assert_same_run(got: Path, want: Path) -> None:
    """Same steps, losses and validation losses to TOL; same final parameters to 1e-4.

    Parameters get a looser bound: AdamW's step for a gradient near its eps turns a
    rounding-level change of the gradient (sums in another order) into a change of up to a
    fraction of lr (1e-2 here) in that one parameter."""
    a, b = _losses(got), _losses(want)
    assert [s for s, _ in a] == [s for s, _ in b]
    worst = max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True))
    assert worst < TOL, f"training loss differs by {worst:.2e}"
    va = [r["val_loss"] for r in read_metrics(got) if "val_loss" in r]
    vb = [r["val_loss"] for r in read_metrics(want) if "val_loss" in r]
    np.testing.assert_allclose(va, vb, atol=TOL, rtol=0)
    pa, pb = checkpoint.load(got).params, checkpoint.load(want).params
    np.testing.assert_allclose(pa, pb, atol=1e-4, rtol=0)


def _rank_env(tmp_path: Path) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", EULER_CACHE=str(tmp_path / "cache"))  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _euler(tmp_path: Path, *args: str, mpiexec: int = 0) -> subprocess.CompletedProcess:
    """`euler ARGS` in a subprocess (under `mpiexec -n N` when mpiexec=N); must exit 0."""
    cmd = [sys.executable, "-m", "euler.cli", *args]
    if mpiexec:
        cmd = [distributed.mpiexec_path(), "-n", str(mpiexec), *cmd]
    res = subprocess.run(cmd, env=_rank_env(tmp_path), capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _cli_args(tc) -> list[str]:
    """The `euler train`/`euler sft` options that reproduce a tiny_config."""
    args = [
        "--data", tc.data, "--out", tc.out_dir, "--batch-size", str(tc.batch_size),
        "--steps", str(tc.steps), "--lr", str(tc.lr), "--min-lr", str(tc.min_lr),
        "--warmup-steps", str(tc.warmup_steps), "--eval-every", str(tc.eval_every),
        "--eval-batches", str(tc.eval_batches), "--sample-tokens", str(tc.sample_tokens),
        "--ckpt-every", str(tc.ckpt_every), "--grad-accum", str(tc.grad_accum),
        "--seed", str(tc.seed),
    ]  # fmt: skip
    if tc.kind == "sft":
        return ["sft", "--checkpoint", tc.init_from, *args]
    return ["train", "--preset", tc.preset, *args]


# ---------------------------------------------------------------------------- in process


def test_shards_with_global_head_weights_add_up_to_the_global_gradient():
    """Masked targets (unequal counts per rank and per head): exact in float64; the ranks'
    own head weights (a plain mean of per-rank means) would not be."""
    cfg = get_preset("tiny")
    B, T, K = 4, 16, cfg.n_mtp
    rng = np.random.default_rng(0)
    window = rng.integers(0, cfg.vocab_size, size=(B, T + K)).astype(np.int32)
    mask = (rng.random((B, T + K)) < np.array([[0.9], [0.6], [0.3], [0.1]])).astype(np.uint8)
    tokens, targets = window[:, :T], make_targets(window, T, K, mask)
    model = Model(cfg, dtype=np.float64, seed=1)

    def grad(tok, tgt, scale=None):
        loss = model.forward(tok, tgt, need_grad=True, head_scale=scale)
        model.backward()
        return loss, model.grads.copy()

    want_loss, want = grad(tokens, targets)
    ranks = [SimpleNamespace(rank=r, size=2) for r in range(2)]
    shares = [grad(*distributed.shard_batch(tokens, targets, c)) for c in ranks]
    loss = np.mean([s[0] for s in shares])
    got = np.mean([s[1] for s in shares], axis=0)
    assert abs(loss - want_loss) < 1e-12
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=1e-10)
    naive = np.mean([grad(*distributed.shard_batch(tokens, targets, c)[:2])[1] for c in ranks], 0)
    assert np.abs(naive - want).max() > 1e-4  # the test above can tell the difference


def test_one_process_is_a_single_rank_and_needs_no_mpi(monkeypatch):
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    comm = distributed.connect("cpu")
    assert (comm.rank, comm.size) == (0, 1)
    buf = np.arange(3.0)
    comm.allreduce_mean(buf)
    comm.broadcast(buf)
    assert buf.tolist() == [0.0, 1.0, 2.0]
    tokens, targets = np.zeros((3, 4), np.int32), np.zeros((2, 3, 4), np.int32)
    t, g, scale = distributed.shard_batch(tokens, targets, comm)
    assert t.shape == (3, 4) and g.shape == (2, 3, 4) and scale.tolist() == [1 / 24, 1 / 24]


def test_a_batch_the_ranks_cannot_split_is_refused(data_root, tmp_path, monkeypatch, capsys):
    from tests.train_helpers import run_cli

    with pytest.raises(EulerError, match="--batch-size 3 must be a multiple of the 2 ranks"):
        distributed.check_batch(3, 2)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--data",
                           str(data_root / "pre"), "--out", str(tmp_path / "r"),
                           "--batch-size", "3", "--nproc", "2")  # fmt: skip
    assert code == 2 and "multiple of the 2 ranks" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- under mpiexec


@needs_mpi
def test_two_ranks_train_as_one_process_on_the_combined_batch(data_root, tmp_path):
    """`euler train --nproc 2` (it re-launches itself under mpiexec) vs train() in process."""
    tc = tiny_config(tmp_path / "one", data_root / "pre", batch_size=4, steps=6, grad_accum=2)
    train(tc)
    two = tmp_path / "two"
    res = _euler(tmp_path, *_cli_args(tc), "--out", str(two), "--nproc", "2")
    assert res.stdout.count("done: step 6") == 1  # rank 0 speaks for both
    _assert_same_run(two, tmp_path / "one")
    assert json.loads((two / "run.json").read_text())["train"]["batch_size"] == 4  # global B


@needs_mpi
def test_two_ranks_resume_a_one_process_checkpoint(data_root, tmp_path, monkeypatch):
    """A run cut at step 6 by Ctrl-C in one process, resumed by 2 ranks, repeats the
    uninterrupted run's losses: the checkpoint does not depend on the number of ranks."""
    train(tiny_config(tmp_path / "whole", data_root / "pre", batch_size=4, steps=10))
    real_lr_at = train_mod.lr_at

    def ctrl_c_at_step_6(step, tc, total):
        if step == 5:
            signal.raise_signal(signal.SIGINT)
        return real_lr_at(step, tc, total)

    monkeypatch.setattr(train_mod, "lr_at", ctrl_c_at_step_6)
    cut = tmp_path / "cut"
    assert train(tiny_config(cut, data_root / "pre", batch_size=4, steps=10))["interrupted"]
    res = _euler(tmp_path, "train", "--resume", str(cut), "--nproc", "2")
    assert f"resuming {cut} at step 6" in res.stdout
    _assert_same_run(cut, tmp_path / "whole")


@needs_mpi
def test_sft_started_under_mpiexec_weighs_the_masks_by_global_counts(data_root, tmp_path):
    """SFT rows hold different numbers of response tokens: still the single-process run."""
    pre = tmp_path / "pre"
    train(tiny_config(pre, data_root / "pre", steps=2))
    tc = tiny_config(tmp_path / "one", data_root / "sft", kind="sft", init_from=str(pre),
                     batch_size=4, steps=4, preset="ignored")  # fmt: skip
    train(tc)
    _euler(tmp_path, *_cli_args(tc), "--out", str(tmp_path / "two"), mpiexec=2)
    _assert_same_run(tmp_path / "two", tmp_path / "one")


@needs_mpi
def test_nproc_must_match_the_ranks_mpiexec_started(data_root, tmp_path):
    cmd = [distributed.mpiexec_path(), "-n", "2", sys.executable, "-m", "euler.cli", "train",
           "--preset", "tiny", "--data", str(data_root / "pre"), "--out", str(tmp_path / "r"),
           "--batch-size", "4", "--nproc", "4"]  # fmt: skip
    res = subprocess.run(cmd, env=_rank_env(tmp_path), capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode != 0 and "--nproc 4, but mpiexec started 2 ranks" in res.stderr


@needs_mpi
def test_an_error_on_rank_0_stops_every_rank(data_root, tmp_path):
    """Rank 0 alone refuses a held run folder; the other rank must not wait forever."""
    held = tmp_path / "held"
    train(tiny_config(held, data_root / "pre", steps=1))
    cmd = [sys.executable, "-m", "euler.cli", "train", "--preset", "tiny", "--out", str(held),
           "--data", str(data_root / "pre"), "--batch-size", "4", "--nproc", "2"]  # fmt: skip
    res = subprocess.run(cmd, env=_rank_env(tmp_path), capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 2 and "already holds a pretrain run" in res.stderr


# ---------------------------------------------------------------------------- NCCL


def _nccl_or_skip():
    try:
        return nccl.load_library()
    except EulerError:
        pytest.skip("no NCCL library (pip install nvidia-nccl-cu13)")


def test_missing_nccl_is_one_line(monkeypatch):
    monkeypatch.setattr(nccl, "_candidates", lambda: ["/nonexistent/libnccl.so.2"])
    with pytest.raises(EulerError) as e:
        nccl.NcclComm(SimpleNamespace(rank=0, size=2))
    assert "NCCL not found" in str(e.value) and "pip install nvidia-nccl" in str(e.value)
    assert "\n" not in str(e.value)


def test_nccl_cpu_side_calls():
    """Version and unique ids need no GPU; ncclAvg (for the mean) exists since NCCL 2.10."""
    lib = _nccl_or_skip()
    assert nccl.version(lib) >= 21000
    a, b = nccl.unique_id(lib), nccl.unique_id(lib)
    assert len(a) == nccl.UNIQUE_ID_BYTES and a != b


def test_nccl_constants_match_the_wheels_header():
    _nccl_or_skip()
    spec = importlib.util.find_spec("nvidia.nccl")
    header = next((Path(p, "include", "nccl.h") for p in (spec.submodule_search_locations or [])
                   if Path(p, "include", "nccl.h").is_file()), None) if spec else None  # fmt: skip
    if header is None:
        pytest.skip("the NCCL wheel's nccl.h is not installed")
    text = header.read_text()
    value = lambda name: int(re.search(rf"\b{name}\s*=\s*(\d+)", text).group(1))  # noqa: E731
    assert value("ncclFloat32") == nccl.DTYPES[np.dtype(np.float32)]
    assert value("ncclFloat64") == nccl.DTYPES[np.dtype(np.float64)]
    assert value("ncclAvg") == nccl.NCCL_AVG
    assert f"NCCL_UNIQUE_ID_BYTES {nccl.UNIQUE_ID_BYTES}" in text


def test_file_rendezvous_hands_rank_0s_id_to_the_others(tmp_path):
    path = tmp_path / "nccl-id"
    uid = os.urandom(nccl.UNIQUE_ID_BYTES)
    got = {}
    others = [threading.Thread(target=lambda r=r: got.__setitem__(r, nccl.file_rendezvous(
        path, r, make_id=None, timeout=10))) for r in (1, 2)]  # fmt: skip
    for t in others:
        t.start()
    assert nccl.file_rendezvous(path, 0, make_id=lambda: uid) == uid
    for t in others:
        t.join()
    assert got == {1: uid, 2: uid}
    with pytest.raises(EulerError, match="rendezvous"):
        nccl.file_rendezvous(tmp_path / "never", 1, make_id=None, timeout=0.05)


@pytest.mark.gpu
def test_nccl_one_rank_on_a_gpu():
    """One rank's mean and broadcast are the identity, on the backend's stream."""
    pytest.importorskip("numba.cuda")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no CUDA GPU")
    from euler.gpu.backend import GpuBackend

    lib = _nccl_or_skip()
    be = GpuBackend()
    handle = be.stream.handle
    comm = nccl.Nccl(lib, nccl.unique_id(lib), 0, 1, int(getattr(handle, "value", handle)))
    x = np.arange(1000, dtype=np.float32)
    buf = be.to_device(x)
    comm.allreduce_mean(buf)
    comm.broadcast(buf)
    np.testing.assert_array_equal(be.to_host(buf), x)
    comm.close()


@pytest.mark.gpu
@needs_mpi
def test_two_gpu_ranks_train_as_one_gpu(data_root, tmp_path):
    """`--device cuda --nproc 2` (NCCL) against one GPU, exact fp32 (--precision fp32)."""
    pytest.importorskip("numba.cuda")
    from numba import cuda

    if not cuda.is_available() or len(cuda.gpus) < 2:
        pytest.skip("needs 2 CUDA GPUs")
    _nccl_or_skip()
    tc = tiny_config(tmp_path / "one", data_root / "pre", batch_size=4, steps=6,
                     device="cuda", precision="fp32")  # fmt: skip
    train(tc)
    args = [*_cli_args(tc), "--device", "cuda", "--precision", "fp32"]
    _euler(tmp_path, *args, "--out", str(tmp_path / "two"), "--nproc", "2")
    _assert_same_run(tmp_path / "two", tmp_path / "one")
