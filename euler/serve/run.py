"""Serving a checkpoint: load it, warm the kernels, start the scheduler and uvicorn."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path

from euler.errors import EulerError
from euler.serve.protocol import ServeConfig


def is_loopback(host: str) -> bool:
    """Whether host names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def model_id(checkpoint: Path) -> str:
    """The served model's id: a run folder's name, also for a run's own checkpoint-*.safetensors
    file; any other file's name without its suffix (`euler import --out smol.safetensors`
    serves as 'smol', not as its parent folder's name)."""
    path = checkpoint.resolve()
    if path.is_file() and path.name.startswith("checkpoint"):
        path = path.parent
    return (path.name if path.is_dir() else path.stem) or "euler"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); EulerError if refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]  # fmt: skip
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise EulerError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror or e})"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    checkpoint: Path,
    host: str,
    port: int,
    device: str,
    cfg: ServeConfig,
    say: Callable[[str], None] = print,
) -> None:
    """Serve checkpoint (a file or run folder) on host:port until interrupted; say() gets
    the line naming the address once the server listens, with the model ready."""
    try:
        import fastapi  # noqa: F401  (euler.serve.app's, imported once the model is loaded)
        import uvicorn
    except ImportError:
        raise EulerError(
            "euler serve needs FastAPI and uvicorn: pip install -e '.[serve]'"
        ) from None
    sock = bind(host, port)  # first: a taken port is refused before the model loads
    try:
        _serve_on(sock, checkpoint, device, cfg, say, uvicorn)
    finally:
        sock.close()


def _serve_on(sock: socket.socket, checkpoint: Path, device: str, cfg: ServeConfig, say,
              uvicorn) -> None:  # fmt: skip
    """serve() on a bound socket: load, warm up, schedule, run uvicorn until interrupted."""
    from euler.backend import make_backend
    from euler.inference.batch import BatchDecoder
    from euler.inference.engine import GenRequest, generate_batch
    from euler.serve.app import create_app
    from euler.serve.scheduler import Scheduler
    from euler.training import checkpoint as ckpt

    ck = ckpt.load(checkpoint)
    tok = ck.tokenizer()
    limit = cfg.limits.max_tokens
    if limit is not None and not 1 <= limit <= ck.cfg.context:
        raise EulerError(f"--max-tokens must be in [1, {ck.cfg.context}] (the model's "
                         f"context), got {limit}")  # fmt: skip
    dec = BatchDecoder(ck.cfg, ck.params, cfg.slots, backend=make_backend(device, "fp32"),
                       threads=cfg.threads)  # fmt: skip
    # compile (or load) every kernel a request runs now, not on the first request
    generate_batch(dec, [GenRequest(tuple(tok.encode("warm up").tolist()) or (tok.eot_id,), 2)])
    scheduler = Scheduler(dec, tok, cfg.max_queue, cfg.prefill_chunk)
    app = create_app(cfg, scheduler, ck.cfg.context, say)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    where = sock.getsockname()
    url_host = f"[{where[0]}]" if sock.family == socket.AF_INET6 else where[0]
    say(f"serving {cfg.model_name} (step {ck.step}) at http://{url_host}:{where[1]}/ "
        f"({cfg.slots} slots, {cfg.threads} threads; OpenAI API at /v1)")  # fmt: skip
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.close()
