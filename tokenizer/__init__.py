"""Byte-level BPE tokenizer (GPT-2 pretokenization, fixed special ids); see tokenizer.py."""

from .tokenizer import SPECIAL_TOKENS, Tokenizer

__all__ = ["SPECIAL_TOKENS", "Tokenizer"]
