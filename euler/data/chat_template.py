"""The chat template: the one place that says how a conversation turn becomes tokens.

    <|user|> PROMPT <|end|> <|assistant|> RESPONSE <|end|>

PROMPT is the instruction, followed by a blank line and the input when the input
is not empty; RESPONSE is the output. Texts are stripped of surrounding whitespace
and encoded with allow_special=False, so a literal "<|end|>" typed by a user stays
plain text. Training (SFT) learns only RESPONSE and its closing <|end|>; at chat
time the model is fed `encode_prompt(...)` and generates until <|end|>.
Sequences shorter than the window are padded with <|endoftext|>, which is masked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from euler.tokenizer import Tokenizer

USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"
PAD = "<|endoftext|>"


def prompt_text(instruction: str, input: str = "") -> str:
    """The user turn's text: instruction, plus a blank line and the input if there is one."""
    instruction, input = instruction.strip(), input.strip()
    return f"{instruction}\n\n{input}" if input else instruction


def render(instruction: str, input: str, output: str) -> str:
    """The whole example as text with the special tokens spelled out (for display)."""
    return f"{USER}{prompt_text(instruction, input)}{END}{ASSISTANT}{output.strip()}{END}"


def prompt_ids(tok: Tokenizer, prompt_tokens: np.ndarray) -> np.ndarray:
    """(P,) int32: <|user|> prompt <|end|> <|assistant|>, from the prompt text's ids."""
    return np.concatenate([[tok.user_id], prompt_tokens, [tok.end_id, tok.assistant_id]]).astype(
        np.int32
    )


def response_ids(tok: Tokenizer, response_tokens: np.ndarray) -> np.ndarray:
    """(R,) int32: the response's ids followed by <|end|>."""
    return np.concatenate([response_tokens, [tok.end_id]]).astype(np.int32)


def encode_prompt(tok: Tokenizer, instruction: str, input: str = "") -> np.ndarray:
    """(P,) int32 ids the model continues at chat time; stop generating at tok.end_id."""
    return prompt_ids(tok, tok.encode(prompt_text(instruction, input)))


def encode_example(
    tok: Tokenizer, instruction: str, input: str, output: str
) -> tuple[np.ndarray, np.ndarray]:
    """(L,) int32 ids and (L,) uint8 loss mask of one example: 1 on the response and its <|end|>."""
    p = encode_prompt(tok, instruction, input)
    r = response_ids(tok, tok.encode(output.strip()))
    mask = np.concatenate([np.zeros(len(p), np.uint8), np.ones(len(r), np.uint8)])
    return np.concatenate([p, r]), mask
