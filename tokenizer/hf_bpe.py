"""Someone else's GPT-2-style byte-level BPE (a Hugging Face tokenizer.json or a GGUF's
tokenizer fields), encoding exactly as the `tokenizers` library does.

What it reads: a `BPE` model (vocabulary token -> id, ids 0..V-1 without holes; ranked
merges over any vocabulary tokens, as "a b" strings or [a, b] pairs; `ignore_merges`),
added tokens (special or not, matched whole, longest first), no normalizer, and one of the
pre-tokenizers such models ship: `ByteLevel` (the GPT-2 regex), `Digits` (each digit alone)
then `ByteLevel`, or `Split` (a regex, isolated) then `ByteLevel` without its regex.
Anything else is refused in one line naming the field, never approximated.

Encoding follows `tokenizers` step by step: added tokens split the text first (when
allow_special; otherwise their text is plain text), each remaining piece is pre-tokenized,
each pre-token's UTF-8 bytes are spelled in the byte alphabet (bytes_to_unicode), and the BPE
repeatedly merges the adjacent pair of lowest rank, leftmost first, until none applies. A
byte the vocabulary lacks (only bytes that no valid UTF-8 holds) becomes `unk_token`, or
nothing without one, as in `tokenizers`.

The checkpoint stores `to_json()`: our wrapper `{"format": "nanoeuler-hf-bpe", "version",
"tokenizer": the tokenizer.json document, "chat": the chat template (euler.chat)}`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import regex

from euler.errors import EulerError
from euler.schema import Fields, parse_json

from .pretokenize import GPT2_PATTERN

FORMAT = "nanoeuler-hf-bpe"
VERSION = 1


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte alphabet of byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


@functools.cache
def _byte_decoder() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


class HFByteLevelBPE:
    """A foreign byte-level BPE; build with from_tokenizer_json, from_gguf or loads."""

    def __init__(self, doc: dict, chat: dict | None, where: str):
        self.doc, self.where = doc, where
        self.chat_spec = chat
        f = Fields(doc, where)
        model = f.obj("model")
        if model.str("type") != "BPE":
            model.fail("type", "BPE", model.get("type"))
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key, None) not in (None, ""):
                model.fail(key, "null (not supported)", model.get(key))
        if model.get("byte_fallback", False):
            model.fail("byte_fallback", "false (a byte-level vocabulary needs none)", True)
        self.ignore_merges = bool(model.get("ignore_merges", False))
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            model.fail("vocab", "an object token -> id", vocab)
        if not vocab:
            raise EulerError(f"{where}: model.vocab: is empty (expected token -> id)")
        self.vocab: dict[str, int] = {}
        for tok, i in vocab.items():
            if type(i) is not int or i < 0:
                raise EulerError(f"{where}: model.vocab[{tok!r}]: expected an id >= 0, found {i!r}")
            self.vocab[tok] = i
        added = {}
        for n, a in enumerate(f.list("added_tokens", [])):
            af = Fields(a, where, f"added_tokens[{n}]")
            content, i = af.str("content"), af.int("id", lo=0)
            for key in ("lstrip", "rstrip", "single_word"):
                if af.get(key, False):
                    af.fail(key, "false (not supported)", True)
            added[content] = (i, bool(af.get("special", False)))
        ids = {**self.vocab, **{c: i for c, (i, _) in added.items()}}
        size = max(ids.values()) + 1
        self._tokens: list[str | None] = [None] * size
        for tok, i in ids.items():
            if self._tokens[i] is not None and self._tokens[i] != tok:
                raise EulerError(f"{where}: id {i} names two tokens {self._tokens[i]!r}, {tok!r}")
            self._tokens[i] = tok
        holes = [i for i, t in enumerate(self._tokens) if t is None]
        if holes:
            raise EulerError(
                f"{where}: model.vocab: no token has id {holes[0]} (ids must be 0..V-1)"
            )
        self.added = {c: i for c, (i, _) in added.items()}
        self.special_ids = {i for c, (i, sp) in added.items() if sp}
        self._added_re = (
            regex.compile("|".join(map(regex.escape, sorted(self.added, key=len, reverse=True))))
            if self.added
            else None
        )
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(model.list("merges")):
            pair = (
                tuple(m.split(" "))
                if isinstance(m, str)
                else tuple(m)
                if isinstance(m, list)
                else ()
            )
            if len(pair) != 2 or not all(isinstance(p, str) for p in pair):
                raise EulerError(
                    f"{where}: model.merges[{r}]: expected 'a b' or [a, b], found {m!r:.40}"
                )
            if pair[0] not in self.vocab or pair[1] not in self.vocab:
                raise EulerError(
                    f"{where}: model.merges[{r}] {m!r:.40}: a part is not in the vocab"
                )
            if pair[0] + pair[1] not in self.vocab:
                raise EulerError(
                    f"{where}: model.merges[{r}] {m!r:.40}: the merged token is not in the vocab"
                )
            self.ranks.setdefault(pair, r)
        self._split_digits, self._pattern = _pre_tokenizer(f, where)
        if f.get("normalizer", None) is not None:
            f.fail("normalizer", "null (not supported)", f.get("normalizer"))
        # A byte no valid UTF-8 holds (0xC0, 0xF5..) may lack a token: `tokenizers` then
        # gives unk_token's id, or drops the byte when there is none; so do we.
        unk = model.get("unk_token", None)
        if model.get("fuse_unk", False):
            model.fail("fuse_unk", "false (not supported)", True)
        if unk is not None and unk not in self.vocab:
            model.fail("unk_token", "a vocabulary token or null", unk)
        self.unk_id = None if unk is None else self.vocab[unk]
        self._cache: dict[str, tuple[int, ...]] = {}
        self.sha256 = hashlib.sha256(self.to_json().encode()).hexdigest()

    # ------------------------------------------------------------ construction

    @classmethod
    def from_tokenizer_json(cls, text: str, where: str, chat: dict | None = None) -> HFByteLevelBPE:
        """From the text of a Hugging Face tokenizer.json; errors name `where`."""
        doc = parse_json(text, where)
        if not isinstance(doc, dict):
            raise EulerError(f"{where}: not a tokenizer.json (expected an object)")
        return cls(doc, chat, where)

    @classmethod
    def from_gguf(
        cls, tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], pre: str,
        where: str, chat: dict | None = None,
    ) -> HFByteLevelBPE:  # fmt: skip
        """From a GGUF's tokenizer.ggml.{tokens, token_type, merges, pre} (model gpt2):
        control tokens (type 3) become special added tokens, user-defined ones (4) plain
        added tokens; `pre` picks the pre-tokenizer as llama.cpp does."""
        pre_tok = GGUF_PRE.get(pre)
        if pre_tok is None:
            raise EulerError(
                f"{where}: tokenizer.ggml.pre is {pre!r}; NanoEuler reads {sorted(GGUF_PRE)}"
            )
        flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        added = [
            {"id": i, "content": t, **flags, "special": ty == 3}
            for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
            if ty in (3, 4)
        ]
        doc = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": pre_tok,
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None,
                "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                "vocab": {t: i for i, t in enumerate(tokens)},
                "merges": [m.split(" ") for m in merges],
            },
        }  # fmt: skip
        return cls(doc, chat, where)

    @classmethod
    def loads(cls, text: str, where: str) -> HFByteLevelBPE:
        """Parse to_json()'s text (a checkpoint's embedded copy)."""
        return cls.from_wrapper(parse_json(text, where), where)

    @classmethod
    def from_wrapper(cls, doc: object, where: str) -> HFByteLevelBPE:
        """From the parsed wrapper document that to_json() writes."""
        f = Fields(doc, where)
        f.only(("format", "version", "tokenizer", "chat"))
        if f.str("format") != FORMAT:
            f.fail("format", FORMAT, doc.get("format"))
        if f.int("version") != VERSION:
            f.fail("version", f"{VERSION} (the version this code reads)", doc["version"])
        chat = f.get("chat", None)
        return cls(f.obj("tokenizer").data, chat, where)

    def to_json(self) -> str:
        """Canonical JSON: our wrapper around the tokenizer.json document and the template."""
        doc = {"format": FORMAT, "version": VERSION, "tokenizer": self.doc, "chat": self.chat_spec}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def save(self, path: str | Path) -> None:
        """Write to_json() atomically."""
        from .tokenizer import _write

        _write(Path(path), self.to_json())

    def to_hf_json(self) -> str:
        """The tokenizer.json document, for `tokenizers`."""
        return json.dumps(self.doc, ensure_ascii=False)

    # ------------------------------------------------------------ identity

    @property
    def vocab_size(self) -> int:
        """V: ids 0..V-1 (vocabulary and added tokens)."""
        return len(self._tokens)

    @property
    def special(self) -> dict[str, int]:
        """Added token text -> id."""
        return dict(self.added)

    def token_id(self, text: str) -> int | None:
        """The id of a token spelled `text` (an added token, or a vocabulary token), or None."""
        return self.added.get(text, self.vocab.get(text))

    @property
    def eot_id(self) -> int:
        """The document separator: <|endoftext|> if the vocabulary has it, else id 0."""
        i = self.token_id("<|endoftext|>")
        return 0 if i is None else i

    @property
    def end_id(self) -> int:
        """The end of an answer: the chat template's end token, else the document separator."""
        end = (self.chat_spec or {}).get("end")
        i = self.token_id(end) if end else None
        return self.eot_id if i is None else i

    def token_bytes(self, i: int) -> bytes:
        """The bytes of token i (an added token's bytes are its text)."""
        tok = self._tokens[i]
        if tok in self.added:
            return tok.encode()
        dec = _byte_decoder()
        return bytes(dec[c] for c in tok)

    def __repr__(self) -> str:
        return f"HFByteLevelBPE(vocab_size={self.vocab_size}, sha256={self.sha256[:12]})"

    # ------------------------------------------------------------ encoding

    def encode(self, text: str, allow_special: bool = False) -> np.ndarray:
        """int32[T] ids of text; added-token text is plain text unless allow_special."""
        out: list[int] = []
        if allow_special and self._added_re is not None:
            at = 0
            for m in self._added_re.finditer(text):
                self._encode_plain(text[at : m.start()], out)
                out.append(self.added[m.group()])
                at = m.end()
            self._encode_plain(text[at:], out)
        else:
            self._encode_plain(text, out)
        return np.asarray(out, np.int32)

    def encode_batch(
        self, texts: Sequence[str], allow_special: bool = False, threads: int | None = None
    ) -> list[np.ndarray]:
        """encode() of each text (one thread)."""
        return [self.encode(t, allow_special) for t in texts]

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """int32[T] ids of UTF-8 bytes (undecodable bytes kept as surrogate escapes)."""
        return self.encode(data.decode("utf-8", "surrogateescape"))

    def _encode_plain(self, text: str, out: list[int]) -> None:
        if not text:
            return
        pieces = regex.split(r"(\p{N})", text) if self._split_digits else [text]
        table = bytes_to_unicode()
        for piece in pieces:
            if not piece:
                continue
            for word in _isolated(self._pattern, piece) if self._pattern else [piece]:
                ids = self._cache.get(word)
                if ids is None:
                    from .tokenizer import utf8

                    spelled = "".join(table[b] for b in utf8(word))
                    ids = self._bpe(spelled)
                    if len(self._cache) < 1 << 18:
                        self._cache[word] = ids
                out.extend(ids)

    def _bpe(self, word: str) -> tuple[int, ...]:
        """The ids of one pre-token spelled in the byte alphabet: merge the lowest-ranked
        adjacent pair, leftmost first, until none is a merge (tokenizers' merge_all)."""
        if self.ignore_merges and word in self.vocab:
            return (self.vocab[word],)
        parts = list(word)  # a byte without a token stays unmerged (no merge names it)
        ranks = self.ranks
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        vocab, unk = self.vocab, self.unk_id
        if all(p in vocab for p in parts):
            return tuple(vocab[p] for p in parts)
        return tuple(vocab.get(p, unk) for p in parts if p in vocab or unk is not None)

    # ------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """The bytes of a sequence of ids (an added token gives its text)."""
        ids = np.asarray(ids, np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise EulerError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return b"".join(self.token_bytes(i) for i in ids.tolist())

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of a sequence of ids; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """text cut at pattern's matches, each match and each gap between them a piece
    (tokenizers' Split behavior Isolated)."""
    out, at = [], 0
    for m in pattern.finditer(text):
        if m.start() > at:
            out.append(text[at : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": True,
    "use_regex": True,
}
# tokenizer.ggml.pre -> the tokenizer.json pre_tokenizer llama.cpp's regexes amount to
GGUF_PRE = {
    "default": _BYTE_LEVEL,
    "gpt-2": _BYTE_LEVEL,
    "gpt2": _BYTE_LEVEL,
    # \p{N} alone first, then GPT-2's regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM; the
    # same as SmolLM2's own tokenizer.json)
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
    },
}


def _pre_tokenizer(f: Fields, where: str) -> tuple[bool, regex.Pattern | None]:
    """(split digits first, the regex that cuts pre-tokens) from f's pre_tokenizer; a one-line
    error for any other pre-tokenizer."""
    pre = f.get("pre_tokenizer", None)
    steps = (
        pre.get("pretokenizers")
        if isinstance(pre, dict) and pre.get("type") == "Sequence"
        else [pre]
    )
    if not isinstance(steps, list) or not steps:
        f.fail("pre_tokenizer", "ByteLevel, or a Sequence ending in ByteLevel", pre)
    *first, last = steps
    if not isinstance(last, dict) or last.get("type") != "ByteLevel":
        f.fail("pre_tokenizer", "a ByteLevel pre-tokenizer last", pre)
    if last.get("add_prefix_space", False):
        f.fail("pre_tokenizer.add_prefix_space", "false (not supported)", True)
    use_regex = last.get("use_regex", True)
    digits, pattern = False, regex.compile(GPT2_PATTERN) if use_regex else None
    if not first:
        return digits, pattern
    if len(first) != 1 or not isinstance(first[0], dict):
        f.fail("pre_tokenizer", "Digits or Split before ByteLevel", pre)
    step = first[0]
    if step.get("type") == "Digits" and step.get("individual_digits") is True and use_regex:
        return True, pattern
    if step.get("type") == "Split" and not use_regex:
        pat = step.get("pattern", {})
        if step.get("behavior") != "Isolated" or step.get("invert", False):
            f.fail("pre_tokenizer.Split", "behavior Isolated, not inverted", step)
        if "Regex" in pat:
            return False, regex.compile(pat["Regex"])
        if "String" in pat:
            return False, regex.compile(regex.escape(pat["String"]))
    raise EulerError(f"{where}: pre_tokenizer {json.dumps(step)[:80]}: not supported")
