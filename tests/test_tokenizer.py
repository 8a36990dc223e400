"""Tokenizer behaviour (issue 3): fixed ids, special tokens, files and their errors,
training rules against a plain re-count trainer, batches across threads, long inputs."""

from __future__ import annotations

import collections
import hashlib
import json
import random
import time

import numpy as np
import pytest
import regex
from euler.tokenizer import SPECIAL_TOKENS, Tokenizer, train
from euler.tokenizer.bytetable import new_table
from euler.tokenizer.pretokenize import GPT2_PATTERN

from euler.errors import EulerError

WORDS = (
    "the of and a to in is you that it he was for on are as with his they I at be this "
    "have from or one had by word but not what all were we when your can said there use "
    "Euler naïve café Straße 東京 😀 don't it's we're they'll I've 1234 3.14 — “quoted” (x)"
).split()


def corpus(n_words: int, seed: int) -> str:
    """Deterministic English-like text with numbers, Unicode, CRLF lines and odd spacing."""
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        r = rng.random()
        out.append(
            ".\r\n"
            if r < 0.05
            else ", "
            if r < 0.12
            else "  "
            if r < 0.14
            else "\t"
            if r < 0.15
            else "\n\n"
            if r < 0.16
            else " "
        )
        if i % 500 == 499:
            out.append("a" * rng.randint(60, 300) + " ")  # long pretokens: the heap path
    return "".join(out)


def write(path, text: str):
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return [write(d / "a.txt", corpus(30000, 1)), write(d / "b.txt", corpus(20000, 2))]


@pytest.fixture(scope="module")
def tok(files):
    return Tokenizer.train(files, 500)


def test_special_tokens_have_fixed_ids(tok):
    assert SPECIAL_TOKENS == {
        "<|endoftext|>": 256,
        "<|user|>": 257,
        "<|assistant|>": 258,
        "<|end|>": 259,
    }
    assert (tok.eot_id, tok.user_id, tok.assistant_id, tok.end_id) == (256, 257, 258, 259)
    assert tok.special == SPECIAL_TOKENS
    assert tok.vocab_size == 500 and tok.merges.shape == (500 - 260, 2)
    assert tok.merges.min() >= 0 and not np.isin(tok.merges, [256, 257, 258, 259]).any()


def test_special_tokens_are_plain_text_unless_allowed(tok):
    text = "<|user|>hi there<|end|><|assistant|>hello<|endoftext|>"
    plain = tok.encode(text)
    assert not np.isin(plain, list(SPECIAL_TOKENS.values())).any()
    assert tok.decode(plain) == text
    templ = tok.encode(text, allow_special=True)
    assert templ[0] == tok.user_id and templ[-1] == tok.eot_id
    assert list(templ).count(tok.assistant_id) == 1 and list(templ).count(tok.end_id) == 1
    assert tok.decode(templ) == text
    assert templ.dtype == np.int32 and plain.dtype == np.int32


def test_round_trip_and_compression(tok):
    text = corpus(5000, 7)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(text.encode()) / len(ids) > 2.0  # it learned something
    assert tok.encode("").size == 0 and tok.decode([]) == ""


def test_bytes_round_trip_and_invalid_utf8(tok):
    data = bytes(range(256)) + "naïve 東京".encode() + b"\xff\xfe\xc3(\xe2\x82 \xed\xa0\x80"
    ids = tok.encode_bytes(data)
    assert tok.decode_bytes(ids) == data
    assert "\ufffd" in tok.decode(ids)
    text = corpus(300, 3)
    assert (tok.encode_bytes(text.encode()) == tok.encode(text)).all()
    # Bytes smuggled through str as surrogate escapes encode as the raw bytes.
    assert (tok.encode(data.decode("utf-8", "surrogateescape")) == ids).all()


def test_decode_rejects_unknown_ids(tok):
    with pytest.raises(EulerError, match="outside the vocabulary"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(EulerError, match="outside the vocabulary"):
        tok.decode_bytes([-1])


def test_save_load_and_sha256(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == tok.sha256
    again = Tokenizer.load(path)
    assert again.sha256 == tok.sha256 and (again.merges == tok.merges).all()
    text = corpus(500, 4)
    assert (again.encode(text) == tok.encode(text)).all()
    assert Tokenizer(tok.merges[:-1]).sha256 != tok.sha256


def _doc(tok) -> dict:
    return json.loads(tok.to_json())


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "invalid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        ("[1, 2]", "not a NanoEuler tokenizer"),
        ('{"model": {"type": "BPE"}}', "not a NanoEuler tokenizer"),
    ],
)
def test_load_rejects_corrupt_and_foreign_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(EulerError, match=message):
        Tokenizer.load(path)


def test_load_rejects_hf_export_and_bad_merges(tok, tmp_path):
    path = tmp_path / "t.json"
    tok.export_hf(path)
    with pytest.raises(EulerError, match="not a NanoEuler tokenizer"):
        Tokenizer.load(path)
    with pytest.raises(EulerError, match="not found"):
        Tokenizer.load(tmp_path / "missing.json")
    with pytest.raises(EulerError, match="is a folder"):
        Tokenizer.load(tmp_path)
    with pytest.raises(EulerError, match="cannot write"):
        tok.save(tmp_path / "no" / "such" / "dir.json")
    cases = [
        (lambda d: d["merges"].append([256, 97]), r"merges\[\d+\]: expected a pair.*\[256, 97\]"),
        (lambda d: d["merges"].append([97, 10**6]), r"merges\[\d+\].*1000000"),
        (lambda d: d["merges"].append([97]), r"merges\[\d+\]: expected a pair"),
        (lambda d: d["merges"].append([97, True]), r"merges\[\d+\]: expected a pair"),
        (lambda d: d.update(merges={"a": 1}), "merges: expected a list"),
        (lambda d: d.update(vocab_size=5), "vocab_size: expected an integer in"),
        (lambda d: d.update(vocab_size="300"), "vocab_size: expected an integer"),
        (lambda d: d.update(version=99), "version: expected 1"),
        (lambda d: d.update(pattern=r"\w+"), "pattern: expected the GPT-2"),
        (lambda d: d.update(special=[1]), "special: expected the special tokens"),
        (lambda d: d.update(extra=1), "extra: unknown field"),
        (lambda d: d["merges"].append(d["merges"][0]), "existing token"),
    ]
    for edit, message in cases:
        doc = _doc(tok)
        edit(doc)
        if "vocab_size" not in message and isinstance(doc["merges"], list):
            doc["vocab_size"] = 260 + len(doc["merges"])
        path.write_text(json.dumps(doc))
        with pytest.raises(EulerError, match=message):
            Tokenizer.load(path)


def test_train_rejects_bad_inputs(files, tmp_path):
    with pytest.raises(EulerError, match="too small"):
        Tokenizer.train(files, 259)
    with pytest.raises(EulerError, match="not found"):
        Tokenizer.train([tmp_path / "nope.txt"], 300)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(EulerError, match="empty"):
        Tokenizer.train([files[0], empty], 300)
    with pytest.raises(EulerError, match="not a file"):
        Tokenizer.train([tmp_path], 300)
    with pytest.raises(EulerError, match="no input"):
        Tokenizer.train([], 300)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"text first, then " + bytes(range(128, 256)))
    with pytest.raises(EulerError, match=r"binary\.txt: not UTF-8 \(byte 17\)"):
        Tokenizer.train([files[0], binary], 300)
    with pytest.raises(EulerError, match="too large"):
        Tokenizer.train(files, 1 << 30)


def test_loads_parses_text_and_names_where(tok):
    again = Tokenizer.loads(tok.to_json(), "ckpt: tokenizer")
    assert again.sha256 == tok.sha256 and again.vocab_size == tok.vocab_size
    with pytest.raises(EulerError, match=r"^ckpt: tokenizer:1: invalid JSON"):
        Tokenizer.loads("{", "ckpt: tokenizer")
    with pytest.raises(EulerError, match=r"^ckpt: tokenizer: merges\[0\]: expected a pair"):
        Tokenizer.loads(tok.to_json().replace('"merges":[[', '"merges":[[-5,'), "ckpt: tokenizer")


def test_training_is_deterministic_and_ignores_file_order(files, tok):
    again = Tokenizer.train(list(reversed(files)), 500)
    assert again.sha256 == tok.sha256


def test_training_stops_when_pairs_run_out(tmp_path):
    small = write(tmp_path / "s.txt", "abcd abcd")
    tok = Tokenizer.train([small], 1000)
    # " abcd" and "abcd" need 3 + 1 merges (" a" then the shared suffix merges).
    assert 260 < tok.vocab_size < 270
    assert tok.decode(tok.encode("abcd abcd")) == "abcd abcd"
    assert len(tok.encode("abcd abcd")) == 2


def naive_train(texts: list[str], n_merges: int) -> list[tuple[int, int]]:
    """The tie-break rule of train.py with a full re-count of every pair at every step."""
    words = collections.Counter()
    for t in texts:
        words.update(tuple(p.encode()) for p in regex.findall(GPT2_PATTERN, t))
    vocab = [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIAL_TOKENS]
    banned: set[tuple[int, int]] = set()
    merges = []
    while len(merges) < n_merges:
        counts = collections.Counter()
        for w, c in words.items():
            for pair in zip(w, w[1:], strict=False):
                counts[pair] += c
        live = [(c, p) for p, c in counts.items() if p not in banned]
        if not live:
            break
        best = min(live, key=lambda cp: (-cp[0], cp[1]))[1]
        joined = vocab[best[0]] + vocab[best[1]]
        if joined in vocab:
            banned.add(best)
            continue
        new = len(vocab)
        vocab.append(joined)
        merges.append(best)
        merged = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return merges


@pytest.mark.parametrize("capacity", ["default", "tiny"])
def test_training_equals_full_recount(tmp_path, monkeypatch, capacity):
    if capacity == "tiny":  # every table and heap starts almost empty and must grow
        monkeypatch.setattr(train, "COUNTER_ENTRIES", 2)
        monkeypatch.setattr(train, "COUNTER_KEY_BYTES", 4)
        monkeypatch.setattr(train, "EXTRA_PAIRS", 0)
        monkeypatch.setattr(train, "BLOCK_BYTES", 1000)
    texts = [corpus(1500, 11), "aaaa aaaaa aaaaaa  abab ababab\n" * 20 + corpus(200, 12)]
    paths = [write(tmp_path / f"{i}.txt", t) for i, t in enumerate(texts)]
    ours = Tokenizer.train(paths, 260 + 250)
    assert ours.merges.tolist() == [list(m) for m in naive_train(texts, 250)]


def test_a_full_cache_is_cleared_and_ids_stay_exact(tok):
    text = corpus(3000, 9)
    small = Tokenizer(tok.merges)
    small._caches = [new_table(16, 128, 64)]  # holds 15 pretokens: cleared again and again
    assert np.array_equal(small.encode(text), tok.encode(text))


def test_training_skips_pairs_that_remake_a_token(tmp_path):
    # "ab"+"c" and "a"+"bc" would both make "abc"; only the first may.
    path = write(tmp_path / "t.txt", ("abc " * 50) + ("xbc " * 40) + ("a " * 30) + "abc! a bc")
    tok = Tokenizer.train([path], 290)
    made = [tok.token_bytes(i) for i in range(260, tok.vocab_size)]
    assert len(made) == len(set(made))


def test_encode_batch_equals_encode(tok):
    big = corpus(60000, 5)  # > 2 x 64 KiB: the threads split it at context-free cuts
    texts = [big, "", "x", corpus(50, 6) + "<|user|>", big[:70001], "a" * 200_000]
    for allow in (False, True):
        want = [tok.encode(t, allow_special=allow) for t in texts]
        for threads in (1, 2, None):
            got = tok.encode_batch(texts, allow_special=allow, threads=threads)
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                assert g.dtype == np.int32 and np.array_equal(g, w)
    assert tok.encode_batch([]) == []


def test_pathological_inputs_take_linear_time(tmp_path):
    path = write(tmp_path / "a.txt", ("a" * 1000 + " ") * 50 + "b" * 3000)
    tok = Tokenizer.train([path], 300)  # merges "aa", "aaaa", ... : long heap work
    rng = random.Random(0)
    cases = [
        "a" * 1_000_000,
        "".join(rng.choices("abc!?#", k=2_000_000)),  # no spaces: huge pretokens
        "\n" * 500_000,
    ]
    for text in cases:
        t = time.perf_counter()
        ids = tok.encode(text)
        elapsed = time.perf_counter() - t
        assert tok.decode(ids) == text
        assert elapsed < 10.0, f"{len(text)} chars took {elapsed:.1f} s"
    assert len(tok.encode("a" * 1_000_000)) < 1_000_000 / 16
