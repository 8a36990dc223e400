"""Data-parallel training: which rank this process is, and the collectives the loop needs.

A Comm has `rank` and `size`, and four collectives that every rank must call in the same
order: allreduce_mean (in place, on a flat array), broadcast (in place, from rank 0),
barrier, and bind (ties GPU collectives to the backend's stream). Three implementations:

  SingleProcess  one rank; every collective is a no-op (the default; imports nothing)
  MpiComm        ranks started by mpiexec, on the CPU: mpi4py's buffer methods only (the
                 lowercase ones pickle)
  NcclComm       ranks on GPUs (euler/gpu/nccl.py): NCCL on the backend's stream for device
                 arrays, MPI for host arrays and to hand the NCCL id around

The global batch is what single-process training would see: every rank draws it from
(seed, step), then keeps a contiguous block of B/N rows (shard_batch). Each rank weighs its
heads' losses by the *global* batch's target counts, times N, so the mean over ranks of the
losses and of the gradients equals the single-process loss and gradient of the global batch,
masks (SFT) included, up to float32 summation order.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Protocol

import numpy as np

from euler.errors import EulerError
from euler.model.transformer import head_scales

INSTALL_HINT = "install the dist extra: pip install 'nanoeuler[dist]'"


class Comm(Protocol):
    """What the training loop asks of its ranks."""

    rank: int
    size: int

    def bind(self, backend) -> None: ...
    def allreduce_mean(self, buf) -> None: ...
    def broadcast(self, buf) -> None: ...
    def barrier(self) -> None: ...


class SingleProcess:
    """One rank: nothing to exchange."""

    rank, size = 0, 1

    def bind(self, backend) -> None:
        pass

    def allreduce_mean(self, buf) -> None:
        pass

    def broadcast(self, buf) -> None:
        pass

    def barrier(self) -> None:
        pass


class MpiComm:
    """The ranks of MPI_COMM_WORLD; buffers are contiguous NumPy arrays (host memory)."""

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError:
            raise EulerError(
                f"data-parallel training needs mpi4py and an MPI; {INSTALL_HINT}"
            ) from None
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()

    def local_rank(self) -> int:
        """This rank's index among the ranks on its own node (which GPU it takes)."""
        node = self.world.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_rank()
        finally:
            node.Free()

    def bind(self, backend) -> None:
        pass

    def allreduce_mean(self, buf: np.ndarray) -> None:
        """buf = the mean over ranks of buf, in place (summed, then scaled by 1/N)."""
        self.world.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        buf *= buf.dtype.type(1.0 / self.size)

    def broadcast(self, buf: np.ndarray) -> None:
        """buf = rank 0's buf, in place."""
        self.world.Bcast(buf, root=0)

    def barrier(self) -> None:
        self.world.Barrier()


def launched_size() -> int:
    """How many ranks mpiexec started (MPICH's PMI_SIZE, Open MPI's OMPI_COMM_WORLD_SIZE).

    Read from the environment, so a single process never initialises MPI.
    """
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


def launched_rank() -> int:
    """This process's rank under mpiexec (MPICH's PMI_RANK, Open MPI's
    OMPI_COMM_WORLD_RANK), 0 for a single process; read without initialising MPI."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def connect(device: str = "cpu") -> Comm:
    """This process's Comm: a single process, or MPI (CPU) / NCCL (cuda) ranks under mpiexec.

    Call it before the backend is made: a GPU rank claims its own GPU here.
    """
    if launched_size() == 1:
        return SingleProcess()
    mpi = MpiComm()
    if device == "cuda":
        from euler.gpu.nccl import NcclComm

        return NcclComm(mpi)
    return mpi


def check_batch(batch_size: int, n_ranks: int) -> None:
    """Refuse a global batch that the ranks cannot split evenly."""
    if batch_size % n_ranks:
        raise EulerError(
            f"--batch-size {batch_size} must be a multiple of the {n_ranks} ranks "
            "(each rank takes batch-size / ranks rows of every batch)"
        )


def shard_batch(
    tokens: np.ndarray, targets: np.ndarray, comm: Comm
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This rank's rows of a global batch, and the head weights that make ranks add up.

    tokens (B, T) and targets (K, B, T) are the global batch; returns tokens (B/N, T),
    targets (K, B/N, T) of rows [rank B/N, (rank+1) B/N) and head_scale (K,) = N times the
    global batch's head weights, so that the mean over the N ranks of the loss (and of the
    gradient) is the global batch's. With one rank: the batch and its own head weights.
    """
    B, N = tokens.shape[0], comm.size
    check_batch(B, N)
    rows = slice(comm.rank * B // N, (comm.rank + 1) * B // N)
    return tokens[rows], targets[:, rows], N * head_scales(targets)


def global_mean(comm: Comm, x: float) -> float:
    """The mean over ranks of a host scalar."""
    buf = np.array([x], dtype=np.float64)
    comm.allreduce_mean(buf)
    return float(buf[0])


def any_rank(comm: Comm, flag: bool) -> bool:
    """True on every rank if it is true on any (a Ctrl-C seen by one rank stops them all)."""
    return global_mean(comm, float(flag)) > 0.0


@contextlib.contextmanager
def rank0_first(comm: Comm):
    """Rank 0 runs the block first, the others after it (e.g. a cache rank 0 fills once)."""
    if comm.rank > 0:
        comm.barrier()
    yield
    if comm.rank == 0:
        comm.barrier()


ERROR_DIR_ENV = "EULER_RANK_ERRORS"  # set by relaunch: where a failing rank leaves its message


def _report(message: str, rank: int) -> None:
    """A failing rank's message: to stderr, and to the launcher's folder when relaunch set one.

    MPI_Abort can kill mpiexec's output forwarding before it passes the rank's stderr on,
    so the launcher prints the message from the file itself after mpiexec exits.
    """
    folder = os.environ.get(ERROR_DIR_ENV)
    if folder is None:
        print(message, file=sys.stderr, flush=True)
        return
    (Path(folder) / f"rank{rank}.txt").write_text(message + "\n")


@contextlib.contextmanager
def abort_on_error():
    """Under mpiexec, a rank that fails takes all ranks down (MPI_Abort) with its message.

    Otherwise the others would wait forever in their next collective, and the failing rank
    itself in MPI_Finalize at exit. A single process is left alone.
    """
    try:
        yield
    except (KeyboardInterrupt, Exception) as e:
        if launched_size() == 1:
            raise
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        if isinstance(e, EulerError):
            _report(f"error: {e}", rank)
            code = 2
        elif isinstance(e, KeyboardInterrupt):
            _report("interrupted", rank)
            code = 130
        else:
            _report(traceback.format_exc().rstrip(), rank)
            code = 1
        MPI.COMM_WORLD.Abort(code)


# ---------------------------------------------------------------------------- launching


def mpiexec_path() -> str:
    """mpiexec beside this Python (the MPICH wheel's, which mpi4py finds), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise EulerError(
            f"--nproc needs mpiexec (none beside {sys.executable} or on PATH); {INSTALL_HINT}"
        )
    return found


def relaunch(nproc: int, argv: list[str], threads_per_rank: int | None = None) -> int:
    """Run `euler ARGV` as nproc MPI ranks and wait; returns mpiexec's exit code.

    Each rank's Numba and BLAS thread pools get threads_per_rank threads (default: the
    environment's NUMBA_NUM_THREADS, else the cores / nproc), unless the environment sets a
    pool's own variable: ranks whose pools each take every core oversubscribe the CPU (2
    ranks with OpenBLAS's own 2-thread pools once ran 3x slower than 1). This process ignores
    Ctrl-C while it waits: the ranks get it from the terminal themselves, finish their step
    and save.
    """
    import signal

    try:
        import mpi4py  # noqa: F401 - fail here, with the hint, not in every rank
    except ImportError:
        raise EulerError(f"--nproc needs mpi4py; {INSTALL_HINT}") from None
    env = dict(os.environ)
    threads = threads_per_rank or int(env.get("NUMBA_NUM_THREADS") or 0)
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    for pool in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(pool, str(threads))
    cmd = [mpiexec_path(), "-n", str(nproc), sys.executable, "-m", "euler.cli", *argv]
    with tempfile.TemporaryDirectory(prefix="euler-ranks-") as errors:
        env[ERROR_DIR_ENV] = errors
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, bufsize=1)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            banner = _forward(proc.stdout, sys.stdout)
            code = proc.wait()
        finally:
            signal.signal(signal.SIGINT, old)
        # one line per distinct message: every rank may fail the same way
        messages = dict.fromkeys(f.read_text() for f in sorted(Path(errors).glob("rank*.txt")))
        for message in messages:
            sys.stderr.write(message)
    if code and not messages:  # a rank died without a word: killed, or crashed in C
        sys.stderr.write(f"error: {_died(banner, nproc, _run_folder(argv))}\n")
        return 2
    return 2 if code and all(m.startswith("error: ") for m in messages) else code


# MPICH's report of a rank that died: a block of "=" lines, then three lines of advice
MPICH_BANNER = ("=====", "=   ", "YOUR APPLICATION TERMINATED", "This typically refers to",
                "Please see the FAQ page")  # fmt: skip


def _forward(lines, out) -> list[str]:
    """Pass mpiexec's output (the ranks' own) on line by line, keeping back MPICH's banner
    about a rank that died (returned): its 10 lines become relaunch's one."""
    banner = []
    for line in lines:
        if line.startswith(MPICH_BANNER) or (banner and not line.strip()):
            banner.append(line.rstrip("\n"))
            continue
        out.write(line)
        out.flush()
    return banner


def _run_folder(argv: list[str]) -> str:
    """The run folder a command line names (--out, -o, --resume), else RUN."""
    for i, a in enumerate(argv[:-1]):
        if a in ("--out", "-o", "--resume"):
            return argv[i + 1]
    for a in argv:
        if a.startswith(("--out=", "--resume=")):
            return a.split("=", 1)[1]
    return "RUN"


def _died(banner: list[str], nproc: int, run: str = "RUN") -> str:
    """One line on a rank that died without a message, from MPICH's banner."""
    import re

    text = "\n".join(banner)
    pid = re.search(r"PID (\d+)", text)
    how = re.search(r"EXIT STRING: (.+)", text) or re.search(r"EXIT CODE: (\d+)", text)
    who = f"a rank (PID {pid.group(1)})" if pid else "a rank"
    what = f": {how.group(1).strip()}" if how else ""
    return (f"{who} of the {nproc} stopped without a message{what}; the others were stopped "
            f"too. Checkpoints are written whole or not at all: --resume {run} continues "
            "from the last one")  # fmt: skip
