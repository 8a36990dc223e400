"""The chat template: the one place that says how a conversation turn becomes tokens.

Two templates, chosen by the tokenizer a checkpoint carries (the template is data saved
with it, never guessed from the model):

ours (our Tokenizer):

    <|user|> PROMPT <|end|> <|assistant|> RESPONSE <|end|>

ChatML (an imported model whose template is ChatML, e.g. SmolLM2; its spec is stored in
the tokenizer's wrapper as {"kind": "chatml", "start", "end", "system", "template"}):

    <|im_start|>system\\nSYSTEM<|im_end|>\\n<|im_start|>user\\nPROMPT<|im_end|>\\n
    <|im_start|>assistant\\nRESPONSE<|im_end|>\\n

SYSTEM is the template's default system line (SmolLM2: "You are a helpful AI assistant
named SmolLM, trained by Hugging Face"), written once at the start of a conversation, as
the Jinja template does when no system message is given.

PROMPT is the instruction, followed by a blank line and the input when the input
is not empty; RESPONSE is the output. Texts are stripped of surrounding whitespace
and encoded with allow_special=False, so a literal "<|end|>" typed by a user stays
plain text. Each plain-text span between two special tokens ("user\\n" + PROMPT) is
encoded whole, as `tokenizers` encodes the rendered text. Training (SFT) learns only
RESPONSE and its closing end token; at chat time the model is fed `encode_prompt(...)`
and generates until the end token (tok.end_id).
Sequences shorter than the window are padded with <|endoftext|>, which is masked.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from euler.errors import EulerError

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"
PAD = "<|endoftext|>"


def chatml_spec(template: str | None, where: str) -> dict | None:
    """The ChatML spec of a Jinja chat template (tokenizer.chat_template), or None when the
    template is not ChatML (chat then refuses, naming the field)."""
    if not template or "<|im_start|>" not in template or "<|im_end|>" not in template:
        return None
    m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
    return {
        "kind": "chatml",
        "start": "<|im_start|>",
        "end": "<|im_end|>",
        "system": m.group(1) if m else None,
        "template": template,
        "source": where,
    }


def _chatml(tok) -> dict | None:
    """tok's ChatML spec; None for our own tokenizer; EulerError if it carries none."""
    spec = getattr(tok, "chat_spec", None)
    if not hasattr(tok, "chat_spec"):
        return None  # ours
    if spec is None or spec.get("kind") != "chatml":
        raise EulerError(
            "the checkpoint's tokenizer carries no chat template NanoEuler renders "
            "(tokenizer.chat_template: ChatML is read); use plain text completion instead"
        )
    return spec


def _span(tok, text: str) -> list[int]:
    return tok.encode(text).tolist()


def template_name(tok) -> str:
    """'ours' or 'chatml': the template tok's checkpoint renders conversations with."""
    return "ours" if _chatml(tok) is None else "chatml"


def prompt_text(instruction: str, input: str = "") -> str:
    """The user turn's text: instruction, plus a blank line and the input if there is one."""
    instruction, input = instruction.strip(), input.strip()
    return f"{instruction}\n\n{input}" if input else instruction


def render(instruction: str, input: str, output: str) -> str:
    """The whole example as text with our special tokens spelled out (for display; it also
    names the example for the train/val split, whatever the template)."""
    return f"{USER}{prompt_text(instruction, input)}{END}{ASSISTANT}{output.strip()}{END}"


def system_ids(tok, text: str | None = None) -> np.ndarray:
    """(S,) int32: the conversation's opening system block (ChatML: `text`, or the
    template's default line); empty for ours, which has no system turn."""
    spec = _chatml(tok)
    if spec is None:
        return np.zeros(0, np.int32)
    text = spec["system"] if text is None else text
    if text is None:
        return np.zeros(0, np.int32)
    return turn_ids(tok, "system", text)


def turn_ids(tok, role: str, text: str) -> np.ndarray:
    """(N,) int32 of one whole ChatML turn: <|im_start|>ROLE\\nTEXT<|im_end|>\\n."""
    spec = _chatml(tok)
    start, end = tok.token_id(spec["start"]), tok.token_id(spec["end"])
    ids = [start, *_span(tok, f"{role}\n{text}"), end, *_span(tok, "\n")]
    return np.asarray(ids, np.int32)


def prompt_ids(tok: Tokenizer, prompt_tokens: np.ndarray, system: bool = True) -> np.ndarray:
    """(P,) int32 the answer continues, from the prompt text's ids: ours <|user|> prompt
    <|end|> <|assistant|>; ChatML <|im_start|>user\\n prompt <|im_end|>\\n
    <|im_start|>assistant\\n, after the system block when `system` (a conversation's first
    turn). The prompt's ids were encoded alone; for a stripped prompt that equals encoding
    "user\\n" + prompt whole (a newline followed by a non-space is a pretoken of its own)."""
    spec = _chatml(tok)
    if spec is None:
        ids = [[tok.user_id], prompt_tokens, [tok.end_id, tok.assistant_id]]
        return np.concatenate(ids).astype(np.int32)
    start, end = tok.token_id(spec["start"]), tok.token_id(spec["end"])
    head = system_ids(tok) if system else np.zeros(0, np.int32)
    ids = [head, [start], _span(tok, "user\n"), prompt_tokens, [end], _span(tok, "\n"),
           [start], _span(tok, "assistant\n")]  # fmt: skip
    return np.concatenate(ids).astype(np.int32)


def response_ids(tok: Tokenizer, response_tokens: np.ndarray) -> np.ndarray:
    """(R,) int32: the response's ids followed by the end token (<|end|> or <|im_end|>)."""
    return np.concatenate([response_tokens, [tok.end_id]]).astype(np.int32)


def end_token(tok) -> str:
    """The text of the token an answer ends with: <|end|> (ours) or the template's
    (ChatML: <|im_end|>)."""
    spec = _chatml(tok)
    return END if spec is None else spec["end"]


def turn_gap(tok) -> list[int]:
    """Ids between a finished answer's end token and the next turn (ChatML: "\\n")."""
    return [] if _chatml(tok) is None else _span(tok, "\n")


def encode_prompt(tok: Tokenizer, instruction: str, input: str = "", system: bool = True):
    """(P,) int32 ids the model continues at chat time; stop generating at tok.end_id.
    `system`: open with the template's system block (a conversation's first turn)."""
    return prompt_ids(tok, tok.encode(prompt_text(instruction, input)), system)


def encode_example(
    tok: Tokenizer, instruction: str, input: str, output: str
) -> tuple[np.ndarray, np.ndarray]:
    """(L,) int32 ids and (L,) uint8 loss mask of one example: 1 on the response and its end."""
    p = encode_prompt(tok, instruction, input)
    r = response_ids(tok, tok.encode(output.strip()))
    mask = np.concatenate([np.zeros(len(p), np.uint8), np.ones(len(r), np.uint8)])
    return np.concatenate([p, r]), mask
