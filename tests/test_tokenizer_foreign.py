"""Someone else's byte-level BPE (tokenizer/hf_bpe.py) against the `tokenizers` library.

The tokenizers are trained by `tokenizers` itself inside the test (GPT-2's ByteLevel
pre-tokenizer; SmolLM2's Digits-then-ByteLevel; a Llama-3-style Split regex), with ChatML
special tokens, and compared id for id on held-out books and web text from shared/data
(generated text where that is absent); the merges are also reordered at random, so that
merges name tokens that later merges make, as in real vocabularies. The GGUF field path
(from_gguf) rebuilds the same tokenizer from tokens, types and "a b" merges.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from euler.tokenizer import HFByteLevelBPE, loads_any

from euler.errors import EulerError

tokenizers = pytest.importorskip("tokenizers")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAIN_BOOKS = ["pg11_alices-adventures-in-wonderland.txt", "pg1080_a-modest-proposal.txt"]
HELD_OUT_BOOK = "pg12_through-the-looking-glass.txt"
WEB = DATA / "web" / "c4_demo" / "c4_demo.jsonl"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _generated(seed: int, n: int) -> str:
    rng = random.Random(seed)
    words = "the of and to in it's we'll Éire naïve 東京 😀 42 3.14 1999 — “x” (y) don't".split()
    seps = [" ", " ", " ", ", ", ".\r\n", "\n\n", "  ", "\t", "   \n"]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n))


def _train_text() -> str:
    if all((DATA / "books" / b).exists() for b in TRAIN_BOOKS):
        return "".join((DATA / "books" / b).read_text(encoding="utf-8") for b in TRAIN_BOOKS)
    return _generated(0, 40000)


def _held_out() -> list[str]:
    texts = [_generated(1, 3000)]
    if (DATA / "books" / HELD_OUT_BOOK).exists():
        texts.append((DATA / "books" / HELD_OUT_BOOK).read_text(encoding="utf-8")[:150_000])
    if WEB.exists():
        lines = WEB.read_text(encoding="utf-8").splitlines()[:200]
        texts += [json.loads(line)["text"] for line in lines]
    return texts


def _trained(pre: str, vocab: int = 1200) -> tokenizers.Tokenizer:
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre != "split")
    if pre == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre == "split":
        split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator([_train_text()], trainer)
    return tok


def _shuffled_merges(doc: dict, seed: int) -> dict:
    """The same tokenizer with its merges in a random order: ranks change, so the ids can
    differ from the trained order's, but both sides must still agree."""
    doc = json.loads(json.dumps(doc))
    random.Random(seed).shuffle(doc["model"]["merges"])
    return doc


@pytest.fixture(scope="module", params=["bytelevel", "digits", "split"])
def pair(request):
    hf = _trained(request.param)
    return hf, HFByteLevelBPE.from_tokenizer_json(hf.to_str(), "tokenizer.json")


def _assert_same(ours: HFByteLevelBPE, hf, texts: list[str]) -> int:
    n = 0
    for text in texts:
        want = hf.encode(text, add_special_tokens=False).ids
        got = ours.encode(text, allow_special=True).tolist()
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), -1)
        assert got == want, f"first differing id at {first}"
        n += len(got)
    return n


def test_ids_equal_tokenizers_on_held_out_text(pair) -> None:
    hf, ours = pair
    texts = _held_out()
    chat = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n42<|im_end|>"
    assert _assert_same(ours, hf, [*texts, chat]) > 1000
    assert ours.decode(ours.encode(texts[0])) == texts[0]
    # special text typed by a user stays plain text unless allow_special
    plain = ours.encode("<|im_end|>").tolist()
    assert ours.special["<|im_end|>"] not in plain and len(plain) > 1


def test_merges_in_any_rank_order(pair) -> None:
    hf, _ = pair
    doc = _shuffled_merges(json.loads(hf.to_str()), seed=3)
    text = json.dumps(doc)
    ours = HFByteLevelBPE.from_tokenizer_json(text, "tokenizer.json")
    _assert_same(ours, tokenizers.Tokenizer.from_str(text), _held_out()[:2])


def test_gguf_fields_rebuild_the_tokenizer() -> None:
    """tokens, token types (3: control) and "a b" merges, with tokenizer.ggml.pre."""
    hf = _trained("digits")
    doc = json.loads(hf.to_str())
    vocab = doc["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    types = [3 if t in SPECIALS else 1 for t in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]]
    ours = HFByteLevelBPE.from_gguf(tokens, types, merges, "smollm", "model.gguf")
    _assert_same(ours, hf, _held_out()[:2])
    with pytest.raises(EulerError, match=r"model.gguf: tokenizer.ggml.pre is 'qwen2'"):
        HFByteLevelBPE.from_gguf(tokens, types, merges, "qwen2", "model.gguf")


def test_wrapper_round_trips_with_its_chat_template(tmp_path) -> None:
    hf = _trained("bytelevel", vocab=600)
    chat = {"kind": "chatml", "start": "<|im_start|>", "end": "<|im_end|>", "system": "Hi."}
    ours = HFByteLevelBPE.from_tokenizer_json(hf.to_str(), "tokenizer.json", chat)
    back = loads_any(ours.to_json(), "checkpoint: tokenizer")
    assert isinstance(back, HFByteLevelBPE) and back.sha256 == ours.sha256
    assert back.end_id == ours.special["<|im_end|>"] and back.eot_id == 0
    path = tmp_path / "tok.json"
    ours.save(path)
    from euler.tokenizer import load_any

    assert load_any(path).to_json() == ours.to_json()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer"),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
        (lambda d: d["model"].update(type="WordPiece"), "model.type"),
        (lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback"),
        (lambda d: d["model"]["merges"].append(["Ġzzq", "x"]), r"model.merges\[\d+\]"),
        (lambda d: d["model"]["vocab"].pop("a"), "no token has id"),
        (lambda d: d["added_tokens"][0].update(lstrip=True), r"added_tokens\[0\].lstrip"),
    ],
)
def test_refusals_name_the_field(change, field) -> None:
    doc = json.loads(_trained("bytelevel", vocab=400).to_str())
    change(doc)
    with pytest.raises(EulerError, match=field):
        HFByteLevelBPE.from_tokenizer_json(json.dumps(doc), "tokenizer.json")
