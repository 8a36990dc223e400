"""Byte-level BPE tokenizer (GPT-2 pretokenization, fixed special ids); see tokenizer.py."""

from .tokenizer import FIRST_MERGE_ID, MAX_VOCAB_SIZE, SPECIAL_TOKENS, Tokenizer

__all__ = ["FIRST_MERGE_ID", "MAX_VOCAB_SIZE", "SPECIAL_TOKENS", "Tokenizer"]
