"""Byte-level BPE tokenizers: ours (GPT-2 pretokenization, fixed special ids; tokenizer.py)
and someone else's GPT-2-style one read from a tokenizer.json or a GGUF (hf_bpe.py)."""

from __future__ import annotations

from pathlib import Path

from .hf_bpe import HFByteLevelBPE
from .tokenizer import FIRST_MERGE_ID, MAX_VOCAB_SIZE, SPECIAL_TOKENS, Tokenizer

__all__ = [
    "FIRST_MERGE_ID",
    "MAX_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "HFByteLevelBPE",
    "Tokenizer",
    "load_any",
    "loads_any",
]


def loads_any(text: str, where: str) -> Tokenizer | HFByteLevelBPE:
    """Our tokenizer, or a foreign byte-level BPE in our wrapper (format nanoeuler-hf-bpe),
    from the JSON text that either's to_json() writes; errors name `where`."""
    from euler.schema import parse_json

    return _from_doc(parse_json(text, where), where)


def load_any(path: str | Path) -> Tokenizer | HFByteLevelBPE:
    """loads_any of a file (ours, or a foreign tokenizer saved by HFByteLevelBPE.save)."""
    from euler.schema import read_json

    path = Path(path)
    return _from_doc(read_json(path, "tokenizer file"), str(path))


def _from_doc(doc: object, where: str) -> Tokenizer | HFByteLevelBPE:
    from .hf_bpe import FORMAT as FOREIGN

    if isinstance(doc, dict) and doc.get("format") == FOREIGN:
        return HFByteLevelBPE.from_wrapper(doc, where)
    return Tokenizer._from_doc(doc, where)
