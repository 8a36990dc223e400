"""`euler serve`'s HTTP side: an OpenAI-compatible API and the chat page, on FastAPI.

Routes: POST /v1/chat/completions and /v1/completions (streamed as server-sent events in
OpenAI's chunk format, ending with `data: [DONE]`, or answered whole), GET /v1/models and
/v1/models/{id}, GET /health, and GET / (the chat page, page.html: plain HTML and
JavaScript, nothing fetched from elsewhere). With an API key every /v1 route needs
`Authorization: Bearer KEY` (401 otherwise); / and /health stay open, as llama.cpp's do.

Every error, from a malformed body to an unknown route, is OpenAI's error object with the
field at fault in param (euler.serve.protocol); a body nested deeper than MAX_JSON_DEPTH is
a 400 before it is parsed; a client that leaves during its body is not logged; only a
fault of the server itself is a 500, logged in one line (its traceback only with --debug).
The model runs on the scheduler's thread; each request waits on an asyncio queue that the
scheduler fills, and a streamed request whose client goes away is cancelled (its slot
freed) when Starlette cancels the stream; a request answered whole polls for it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from importlib import resources

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from euler.serve.protocol import (
    ApiError,
    Generation,
    Limits,
    ServeConfig,
    check_model,
    parse_chat,
    parse_completion,
)
from euler.serve.scheduler import Busy, Delta, Done, Failed, Scheduler

DISCONNECT_POLL_S = 0.25  # how often a request answered whole checks for its client
MAX_JSON_DEPTH = 32  # nesting of a request body; OpenAI's bodies need fewer than 8 levels
OPENERS, CLOSERS = [ord("["), ord("{")], [ord("]"), ord("}")]
LOG = logging.getLogger("euler.serve")


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, brackets inside strings
    not counted; found without parsing (a parser recurses once a level)."""
    outside = re.sub(rb'"(?:[^"\\]|\\.)*"', b"", data)
    b = np.frombuffer(outside, np.uint8)
    step = np.isin(b, OPENERS).astype(np.int64) - np.isin(b, CLOSERS)
    return int(np.cumsum(step).max(initial=0))


class OneLineErrors:
    """ASGI middleware: an exception no handler turned into an answer becomes a 500 in
    OpenAI's shape and one line on the console (the traceback only with --debug), not
    the server's traceback; after a response has started, the line only."""

    def __init__(self, app, debug: bool = False):
        self.app, self.debug = app, debug

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            where = f"{scope.get('method')} {scope.get('path')}"
            LOG.error("500 on %s: %s: %s", where, type(e).__name__, str(e).split("\n")[0][:200],
                      exc_info=self.debug)  # fmt: skip
            if not started:
                err = ApiError(500, f"The server failed: {type(e).__name__}.", None, None,
                               "server_error")  # fmt: skip
                await _error(err)(scope, receive, send)


class AccessLog:
    """ASGI middleware: one console line per request once it has been answered (a stream
    when it ends): method, path, status, completion tokens where the model ran, and
    milliseconds. A client that left during its body gets no line (nobody asked)."""

    def __init__(self, app, say):
        self.app, self.say = app, say

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), []

        async def tracked(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        finally:
            state = scope.get("state", {})
            if not state.get("client_gone"):
                tokens = state.get("completion_tokens")
                self.say(
                    f"{scope.get('method')} {scope.get('path')} "
                    f"{status[0] if status else '-'}"
                    + (f" {tokens} tokens" if tokens is not None else "")
                    + f" {(time.perf_counter() - t0) * 1e3:.0f} ms"
                )


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _json_body(request: Request, limits: Limits) -> dict:
    """The body as a JSON object, read up to limits.max_body_bytes."""
    cap = limits.max_body_bytes
    too_big = ApiError(413, f"The request body is larger than {cap} bytes.", None,
                       "request_too_large")  # fmt: skip
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        raise too_big
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > cap:
                raise too_big
    except ClientDisconnect:  # nobody to answer, nothing to log
        request.state.client_gone = True
        raise ApiError(400, "The client closed the connection during the request body.",
                       None, "client_disconnected") from None  # fmt: skip
    depth = json_depth(bytes(data))
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, f"The body of the request nests {depth} levels of arrays and "
                       f"objects; at most {MAX_JSON_DEPTH} are allowed.", None,
                       "invalid_json")  # fmt: skip
    try:
        body = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ApiError(400, f"The body of the request is not valid JSON ({e}).", None,
                       "invalid_json") from None  # fmt: skip
    if not isinstance(body, dict):
        raise ApiError(400, "The body of the request must be a JSON object.", None,
                       "invalid_json")  # fmt: skip
    return body


def create_app(cfg: ServeConfig, scheduler: Scheduler, context: int, say=None) -> FastAPI:
    """The FastAPI app serving scheduler's model (a context of `context` tokens) by cfg;
    say(line) gets the access log (one line a request) unless cfg.access_log is off."""
    app = FastAPI(title="euler serve", docs_url=None, redoc_url=None, openapi_url=None)
    page = resources.files("euler.serve").joinpath("page.html").read_text(encoding="utf-8")
    tok = scheduler.tok
    created = int(time.time())
    model_card = {"id": cfg.model_name, "object": "model", "created": created,
                  "owned_by": "nanoeuler"}  # fmt: skip

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404:
            message, code = (
                f"Unknown request URL: {request.method} {request.url.path}.",
                "unknown_url",
            )
        else:
            message, code = f"{e.detail} ({request.method} {request.url.path}).", None
        return _error(ApiError(e.status_code, message, None, code))

    app.add_middleware(OneLineErrors, debug=cfg.debug)  # every other exception: a 500
    if cfg.access_log and say is not None:  # outside OneLineErrors: it logs the 500 too
        app.add_middleware(AccessLog, say=say)

    def authorize(request: Request) -> None:
        if cfg.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise ApiError(401, "You didn't provide an API key: send it in an Authorization "
                           "header as 'Bearer KEY'.", None, "invalid_api_key")  # fmt: skip
        if not hmac.compare_digest(key.strip().encode(), cfg.api_key.encode()):
            raise ApiError(401, "Incorrect API key provided.", None, "invalid_api_key")

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": cfg.model_name, **scheduler.stats()}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> dict:
        authorize(request)
        check_model({"model": model_id}, cfg.model_name)
        return model_card

    async def _request(request: Request) -> dict:
        """A generation request's body: its key checked, then its JSON and model."""
        authorize(request)
        body = await _json_body(request, cfg.limits)
        check_model(body, cfg.model_name)
        return body

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _request(request)
        return await _answer(request, parse_chat(body, tok, cfg.limits, context))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _request(request)
        return await _answer(request, parse_completion(body, tok, cfg.limits, context))

    async def _answer(request: Request, gen: Generation) -> Response:
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def sink(item: object) -> None:  # called on the scheduler's thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

        try:
            job = scheduler.submit(gen, sink)
        except Busy as e:
            raise ApiError(503, f"The server is busy: {e}.", None, "server_busy",
                           "server_error") from None  # fmt: skip
        shape = _Shape(gen, cfg.model_name)
        if gen.stream:
            return StreamingResponse(_stream(queue, shape, lambda: scheduler.cancel(job),
                                             request.state),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        gone = object()  # what the watcher queues when the client has left

        async def watch() -> None:
            while not await request.is_disconnected():
                await asyncio.sleep(DISCONNECT_POLL_S)
            queue.put_nowait(gone)

        watcher = asyncio.create_task(watch())
        text = []
        try:
            while True:
                item = await queue.get()
                if item is gone:
                    return Response(status_code=499)  # nobody reads it
                if isinstance(item, Delta):
                    text.append(item.text)
                elif isinstance(item, Done):
                    request.state.completion_tokens = item.completion_tokens
                    return JSONResponse(shape.whole("".join(text), item))
                else:
                    raise ApiError(500, f"The model failed: {item.message}.", None,
                                   "model_error", "server_error")  # fmt: skip
        finally:
            watcher.cancel()
            scheduler.cancel(job)

    return app


class _Shape:
    """OpenAI's response objects for one request: chat.completion(.chunk) or text_completion."""

    def __init__(self, gen: Generation, model: str):
        self.gen, self.model = gen, model
        self.chat = gen.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        # a text chunk's event is the same for every token but its text: encode it once,
        # around a placeholder, and each token's text alone (the server's cost per token)
        event = _sse(self.chunk("\x00", None))
        self._before, self._after = event.split(json.dumps("\x00"))

    def text_event(self, text: str) -> str:
        """The server-sent event of a chunk carrying text (as _sse(chunk(text, None)))."""
        return self._before + json.dumps(text) + self._after

    def _head(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        kind += ".chunk" if chunk and self.chat else ""
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def usage(done: Done) -> dict:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens}  # fmt: skip

    def whole(self, text: str, done: Done) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"logprobs": None, "finish_reason": done.finish_reason}
        return {**self._head(chunk=False), "choices": [choice], "usage": self.usage(done)}

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice |= {"logprobs": None, "finish_reason": finish}
        return {**self._head(chunk=True), "choices": [choice]}

    def usage_chunk(self, done: Done) -> dict:
        return {**self._head(chunk=True), "choices": [], "usage": self.usage(done)}


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _stream(queue: asyncio.Queue, shape: _Shape, cancel, state) -> AsyncIterator[str]:
    """The server-sent events of one request; cancel() runs however the stream ends
    (Starlette cancels it when the client disconnects); state: the request's, where the
    completion's token count is left for the access log."""
    try:
        if shape.chat:
            yield _sse(shape.chunk(None, None, role=True))
        while True:
            items = [await queue.get()]
            while not queue.empty():  # a loop that fell behind sends what came in one write
                items.append(queue.get_nowait())
            events = []
            for item in items:
                if isinstance(item, Delta):
                    events.append(shape.text_event(item.text))
                    continue
                if isinstance(item, Done):
                    state.completion_tokens = item.completion_tokens
                    events.append(_sse(shape.chunk(None if shape.chat else "", item.finish_reason)))
                    if shape.gen.include_usage:
                        events.append(_sse(shape.usage_chunk(item)))
                elif isinstance(item, Failed):
                    err = ApiError(500, f"The model failed: {item.message}.", None,
                                   "model_error", "server_error")  # fmt: skip
                    events.append(_sse(err.body()))
                events.append(_sse("[DONE]"))
                yield "".join(events)
                return
            yield "".join(events)
    finally:
        cancel()
