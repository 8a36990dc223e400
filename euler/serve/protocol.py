"""The OpenAI request bodies `euler serve` takes, checked field by field, and its errors.

parse_chat and parse_completion turn a decoded JSON body into a Generation (token ids and
settings) or raise ApiError: the HTTP status and OpenAI's error object
{"error": {"message", "type", "param", "code"}}, whose param names the field at fault
("messages[2].role", "max_tokens"). Nothing a client sends reaches the model unchecked.

Chat messages are rendered by the chat template (euler.data.chat_template): each user turn
(consecutive user messages joined by blank lines, system or developer messages put before
the next user text) becomes <|user|> text <|end|> <|assistant|>, each assistant message
its answer and <|end|>; the last message must be the user's. A model imported with a ChatML
template (euler import) renders every message as its own <|im_start|>role ... <|im_end|>
turn, after the template's default system line unless the first message is a system one,
and stops at <|im_end|> (tok.end_id). Texts are encoded with special
tokens off, so "<|end|>" typed in a message stays plain text. A plain completion's prompt
is preceded by <|endoftext|>, as every pretraining document is.

Fields the server does not implement are refused when set to anything but their neutral
value (n above 1, logprobs, echo, penalties...); fields it does not know are ignored, as
llama.cpp's server does.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from euler.data.chat_template import (
    prompt_ids,
    response_ids,
    system_ids,
    template_name,
    turn_ids,
)
from euler.inference.sampling import SamplingConfig


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; None: as much as the model's context allows."""

    max_messages: int = 128
    max_content_chars: int = 32_768  # one message's text, or a completion's prompt
    max_prompt_tokens: int | None = None  # at most the context minus one
    max_tokens: int | None = None  # completion tokens; at most the context
    max_stop: int = 4  # stop sequences, as OpenAI allows
    max_stop_chars: int = 256
    max_body_bytes: int = 1 << 20


@dataclass(frozen=True)
class ServeConfig:
    """How `euler serve` serves: the model's name, the API key (None: open), the batch's
    slots, the queue behind them, the prompt tokens a request feeds a step, the limits."""

    model_name: str
    api_key: str | None = None
    slots: int = 8
    max_queue: int = 64
    prefill_chunk: int = 64
    limits: Limits = field(default_factory=Limits)
    debug: bool = False  # a server fault's traceback on the console (else one line)
    threads: int = 1  # CPU threads the decoder's kernels run on
    access_log: bool = True  # one console line per request (--quiet: none)


class ApiError(Exception):
    """An HTTP error in OpenAI's shape: status, message, type, param (the field) and code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type,
        )  # fmt: skip

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}  # fmt: skip


@dataclass(frozen=True)
class Generation:
    """What a request asks the model for: continue prompt (token ids) by up to max_tokens
    tokens; stop before stop_ids or at any of the stop strings (cut from the text)."""

    kind: str  # "chat" or "text" (/v1/completions)
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingConfig
    seed: int
    stop_ids: tuple[int, ...]
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def _kind(value) -> str:
    """The JSON type of value, as OpenAI's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _type_error(name: str, want: str, value) -> ApiError:
    return ApiError(400, f"Invalid type for '{name}': expected {want}, but got {_kind(value)} "
                    "instead.", name, "invalid_type")  # fmt: skip


def _value_error(name: str, message: str) -> ApiError:
    return ApiError(400, f"Invalid value for '{name}': {message}", name, "invalid_value")


def _int(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if not lo <= value <= hi:
        raise _value_error(name, f"expected an integer from {lo} to {hi}, got {value}.")
    return value


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    if not (math.isfinite(value) and lo <= value <= hi):
        raise _value_error(name, f"expected a number from {lo:g} to {hi:g}, got {value}.")
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _unsupported(body: dict, neutral: dict) -> None:
    """Refuse every field of neutral that body sets to anything but its neutral values."""
    for name, ok in neutral.items():
        if name in body and body[name] not in ok:
            raise ApiError(400, f"'{name}' is not supported by this server (leave it out, or "
                           f"set it to {ok[0]!r}).", name, "unsupported_parameter")  # fmt: skip


def check_model(body: dict, model: str) -> None:
    """A body's model, if given, must be the served one: 404 model_not_found otherwise."""
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise _type_error("model", "a string", name)
    if name != model:
        raise ApiError(404, f"The model '{name[:100]}' does not exist; this server serves "
                       f"'{model}'.", "model", "model_not_found")  # fmt: skip


def _settings(body: dict, limits: Limits, context: int) -> dict:
    """The sampling and stopping fields both endpoints share, checked."""
    _unsupported(body, {"n": (1, None), "logprobs": (False, None), "top_logprobs": (0, None),
                        "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
                        "logit_bias": ({}, None), "best_of": (1, None), "echo": (False, None),
                        "suffix": (None, ""), "tools": ([], None),
                        "response_format": (None, {"type": "text"})})  # fmt: skip
    most = min(limits.max_tokens or context, context)
    max_tokens = _int(body, "max_tokens", None, 1, most)
    max_tokens = _int(body, "max_completion_tokens", max_tokens, 1, most) or most
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    top_k = _int(body, "top_k", 0, 0, 1 << 20)  # llama.cpp's extension; 0: off
    if top_p == 0.0:  # only the likeliest token: greedy
        temperature, top_p = 0.0, 1.0
    seed = _int(body, "seed", None, -(1 << 63), (1 << 64) - 1)
    seed = secrets.randbits(64) if seed is None else seed % (1 << 64)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    include_usage = bool(options) and _bool(options, "include_usage", False)
    if include_usage and not stream:
        raise _value_error("stream_options", "only allowed when 'stream' is true.")
    return dict(max_tokens=max_tokens, sampling=SamplingConfig(temperature, top_k, top_p),
                seed=seed, stop=_stop(body.get("stop"), limits), stream=stream,
                include_usage=include_usage)  # fmt: skip


def _stop(value, limits: Limits) -> tuple[str, ...]:
    """`stop`: null, a string, or an array of up to max_stop non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise _type_error("stop", "a string or an array of strings", value)
    if len(items) > limits.max_stop:
        raise _value_error("stop", f"at most {limits.max_stop} sequences, got {len(items)}.")
    for i, s in enumerate(items):
        where = f"stop[{i}]" if isinstance(value, list) else "stop"
        if not isinstance(s, str):
            raise _type_error(where, "a string", s)
        if not 1 <= len(s) <= limits.max_stop_chars:
            raise _value_error(where, f"expected 1 to {limits.max_stop_chars} characters, "
                               f"got {len(s)}.")  # fmt: skip
    return tuple(items)


def _text(value, where: str, limits: Limits) -> str:
    """A message's content: a string, or an array of {"type": "text", "text": ...} parts."""
    if value is None:
        return ""
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise _type_error(f"{where}[{i}]", "an object", part)
            if part.get("type") != "text":
                raise _value_error(f"{where}[{i}].type", "only 'text' parts are supported.")
            if not isinstance(part.get("text"), str):
                raise _type_error(f"{where}[{i}].text", "a string", part.get("text"))
            parts.append(part["text"])
        value = "".join(parts)
    if not isinstance(value, str):
        raise _type_error(where, "a string or an array of text parts", value)
    if len(value) > limits.max_content_chars:
        raise _value_error(where, f"at most {limits.max_content_chars} characters, got "
                           f"{len(value)}.")  # fmt: skip
    return value


def _prompt_limit(n: int, limits: Limits, context: int, param: str) -> None:
    most = min(limits.max_prompt_tokens or context - 1, context - 1)
    if n > most:
        raise ApiError(400, f"This model's prompts may hold at most {most} tokens (its context "
                       f"is {context}); this one holds {n}. Shorten it.", param,
                       "context_length_exceeded")  # fmt: skip


def chat_ids(tok, messages: list[tuple[str, str]]) -> np.ndarray:
    """The token ids (P,) int32 of (role, text) messages rendered by the chat template,
    ending with <|assistant|>: the sequence the answer continues."""
    if template_name(tok) == "chatml":
        return _chatml_ids(tok, messages)
    ids, pending, system = [], [], []
    for role, text in messages:
        if role in ("system", "developer"):
            system.append(text.strip())
        elif role == "user":
            pending += [*system, text.strip()]
            system = []
        else:  # an assistant answer closes the turn
            ids += [prompt_ids(tok, tok.encode("\n\n".join(pending))),
                    response_ids(tok, tok.encode(text.strip()))]  # fmt: skip
            pending = []
    ids.append(prompt_ids(tok, tok.encode("\n\n".join(pending))))
    return np.concatenate(ids).astype(np.int32)


def _chatml_ids(tok, messages: list[tuple[str, str]]) -> np.ndarray:
    """ChatML, as the model's Jinja template renders it: the default system line unless
    the first message is a system one, every message as a whole turn (a developer message
    as a system one), then <|im_start|>assistant\n."""
    ids = [] if messages[0][0] in ("system", "developer") else [system_ids(tok)]
    for role, text in messages:
        role = "system" if role == "developer" else role
        ids.append(turn_ids(tok, role, text.strip()))
    spec = tok.chat_spec
    ids.append(np.asarray([tok.token_id(spec["start"]), *tok.encode("assistant\n")], np.int32))
    return np.concatenate(ids).astype(np.int32)


ROLES = ("system", "developer", "user", "assistant")


def parse_chat(body: dict, tok, limits: Limits, context: int) -> Generation:
    """A /v1/chat/completions body as a Generation; ApiError naming the field at fault."""
    messages = body.get("messages")
    if messages is None:
        raise ApiError(400, "Missing required parameter: 'messages'.", "messages",
                       "missing_required_parameter")  # fmt: skip
    if not isinstance(messages, list):
        raise _type_error("messages", "an array", messages)
    if not 1 <= len(messages) <= limits.max_messages:
        raise _value_error("messages", f"expected 1 to {limits.max_messages} messages, got "
                           f"{len(messages)}.")  # fmt: skip
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _type_error(f"messages[{i}]", "an object", m)
        role = m.get("role")
        if not isinstance(role, str):
            raise _type_error(f"messages[{i}].role", "a string", role)
        if role not in ROLES:
            raise _value_error(f"messages[{i}].role", f"'{role[:40]}' is not one of "
                               f"{', '.join(ROLES)}.")  # fmt: skip
        turns.append((role, _text(m.get("content"), f"messages[{i}].content", limits)))
    if turns[-1][0] != "user":
        raise _value_error(f"messages[{len(turns) - 1}].role", "the last message must be the "
                           "user's: the model answers it.")  # fmt: skip
    settings = _settings(body, limits, context)
    ids = chat_ids(tok, turns)
    _prompt_limit(len(ids), limits, context, "messages")
    return Generation("chat", tuple(int(t) for t in ids), stop_ids=ending_ids(tok),
                      **settings)  # fmt: skip


def ending_ids(tok) -> tuple[int, ...]:
    """The tokens that end a generation, chat or text (llama.cpp's end-of-generation
    tokens): the end of an answer and the end of a document. Every other special token (a
    role, a foreign template's marker) is generated but never shown (special_ids)."""
    return tuple(sorted({tok.end_id, tok.eot_id}))


def special_ids(tok) -> frozenset[int]:
    """Every special token: none is ever text a client sees."""
    special = getattr(tok, "special_ids", None)  # a foreign tokenizer: its special ones
    return frozenset(tok.special.values() if special is None else special)


def parse_completion(body: dict, tok, limits: Limits, context: int) -> Generation:
    """A /v1/completions body as a Generation: prompt a string (or an array of one string,
    or of token ids); ApiError naming the field at fault."""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = [tok.eot_id, *tok.encode(_text(prompt, "prompt", limits)).tolist()]
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        if prompt and not 0 <= min(prompt) <= max(prompt) < tok.vocab_size:
            raise _value_error("prompt", f"token ids must be in [0, {tok.vocab_size}).")
        ids = list(prompt) or [tok.eot_id]
    else:
        raise _type_error("prompt", "a string, an array of one string, or of token ids", prompt)
    settings = _settings(body, limits, context)
    _prompt_limit(len(ids), limits, context, "prompt")
    return Generation("text", tuple(ids), stop_ids=ending_ids(tok), **settings)
