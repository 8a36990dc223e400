"""Export to a Hugging Face `tokenizers` tokenizer.json (ByteLevel BPE) with the same ids.

ByteLevel BPE names each byte by a printable character (GPT-2's bytes_to_unicode), so a
token's name is its bytes mapped one by one. Our special tokens become added tokens.
"""

from __future__ import annotations

import functools
import json

from .pretokenize import GPT2_PATTERN


@functools.cache
def byte_names() -> tuple[str, ...]:
    """GPT-2's printable character for each byte 0..255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    names = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in names:
            names[b] = chr(256 + extra)
            extra += 1
    return tuple(names[b] for b in range(256))


def hf_tokenizer_json(vocab: list[bytes], merges: list[tuple[int, int]], special: dict) -> str:
    """tokenizer.json text for tokens `vocab` (id -> bytes), `merges` and `special` (str -> id)."""
    names = byte_names()
    name = ["".join(names[b] for b in tok) for tok in vocab]
    for text, i in special.items():
        name[i] = text
    added = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for text, i in special.items()
    ]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": GPT2_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {n: i for i, n in enumerate(name)},
            # "left right": byte names never contain a space (it is named "Ġ").
            "merges": [f"{name[a]} {name[b]}" for a, b in merges],
        },
    }
    return json.dumps(doc, ensure_ascii=False, indent=1)
