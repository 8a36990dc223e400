"""`euler eval`: bits per byte and instruction metrics on models whose answers are known by
hand, the JSON and table output, and bad input in one line."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.cpu.backend import CpuBackend
from euler.data.corpus import CorpusSource
from euler.data.prepare import is_val, prepare_corpus
from euler.eval.answers import has_loop, rouge_l
from euler.eval.text import evaluate_text, load_text
from euler.model.config import get_preset
from euler.model.params import ParamLayout, init_params
from euler.training import checkpoint as ckpt
from tests.bad_input import Case, assert_refused
from tests.train_helpers import run_cli

TOK = Tokenizer([])  # bytes and the special tokens: one token per byte


def _checkpoint(path, edit=None, tok=TOK, random=False):
    """A tiny model with every block weight zero, so head 0's logits are W[k] . norm(emb[last
    token]): uniform when the embedding is zero, else whatever edit(tensors) wires up; with
    random, initialised weights instead."""
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=tok.vocab_size, context=128)
    layout = ParamLayout(cfg)
    params = init_params(layout, 3) if random else np.zeros(layout.size, np.float32)
    views = layout.views(params)
    if not random:
        views["final_norm"][:] = 1.0
    if edit:
        edit(views)
    ckpt.save(path, cfg, params, None, {"step": 1}, {}, tok.to_json())
    return path


def _alternating(views):
    """After <|assistant|> or " ": "a"; after "a": " " (so the answer is "a a a ...")."""
    a, sp = TOK.encode("a")[0], TOK.encode(" ")[0]
    views["tok_emb"][TOK.assistant_id, 0] = views["tok_emb"][sp, 0] = 1.0
    views["tok_emb"][a, 1] = 1.0
    views["mtp_heads"][0, a, 0] = views["mtp_heads"][0, sp, 1] = 10.0


def _ends_at_once(views):
    """After <|assistant|>: <|end|>."""
    views["tok_emb"][TOK.assistant_id, 2] = 1.0
    views["mtp_heads"][0, TOK.end_id, 2] = 10.0


def test_uniform_model_scores_log2_vocab_bits_per_byte(tmp_path, monkeypatch, capsys):
    """Uniform predictions over V tokens cost ln V nats each; one token per byte: log2 V."""
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("Call me Ishmael. " * 9 + "café", encoding="utf-8")
    (books / "b.txt").write_text("It was the best of times.", encoding="utf-8")
    (tmp_path / "w.jsonl").write_text(json.dumps({"text": "A web page.\nWith two lines."}))
    ck = _checkpoint(tmp_path / "u.safetensors")
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "eval",
        "--checkpoint",
        str(ck),
        "--text",
        str(books),
        "--text",
        str(tmp_path / "w.jsonl"),
        "--json",
        str(tmp_path / "e.json"),
    )
    assert code == 0, err
    res = json.loads((tmp_path / "e.json").read_text())["text"]
    docs = [("Call me Ishmael. " * 9 + "café").strip(), "It was the best of times."]
    web = "A web page.\nWith two lines."
    rows = {r["source"]: r for r in res["sources"]}
    n_books = sum(len(d.encode()) for d in docs)
    assert rows[str(books)]["bytes"] == n_books and rows[str(books)]["documents"] == 2
    # every byte and the second document's <|endoftext|> are predicted, the first is not
    assert rows[str(books)]["tokens"] == n_books + 1
    assert rows[str(tmp_path / "w.jsonl")]["tokens"] == len(web.encode())
    for row in [*res["sources"], res["overall"]]:
        assert row["nats_per_token"] == pytest.approx(math.log(TOK.vocab_size), rel=1e-6)
        expect = math.log2(TOK.vocab_size) * row["tokens"] / row["bytes"]
        assert row["bits_per_byte"] == pytest.approx(expect, rel=1e-6)
    assert res["overall"]["bytes"] == n_books + len(web.encode())
    assert "bits/byte" in out and "overall" in out
    # every head of a uniform model costs ln V a token: the MTP mean beside head 0's
    assert res["mtp_heads"] == 4
    for row in [*res["sources"], res["overall"]]:
        assert row["nats_per_token_mtp_mean"] == pytest.approx(math.log(TOK.vocab_size), 1e-6)
    assert "next-token loss (head 0)" in out and "MTP mean" in out


@pytest.mark.parametrize("n", [30, 157 + 1 + 5, 10_000], ids=["in-doc", "two-docs", "all"])
def test_text_tokens_scores_a_prefix_with_its_own_bytes(n, tmp_path, monkeypatch, capsys):
    """--text-tokens N: the source's first N tokens, N - 1 of them predicted, its bytes and
    documents those of the prefix (separators' bytes not counted); more than it holds: all."""
    books = tmp_path / "books"
    books.mkdir()
    first = "Call me Ishmael. " * 9 + "café"  # 157 bytes, stripped as a document is
    (books / "a.txt").write_text(first + "\n", encoding="utf-8")
    (books / "b.txt").write_text("It was the best of times.", encoding="utf-8")
    ck = _checkpoint(tmp_path / "u.safetensors")
    out = tmp_path / "e.json"
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--checkpoint", str(ck), "--text",
                           str(books), "--text-tokens", str(n), "--json", str(out))  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out.read_text())["text"]["sources"]
    whole = len(first.encode()) + len(b"It was the best of times.")
    if n > whole + 2:
        assert (row["source"], row["tokens"], row["bytes"]) == (str(books), whole + 1, whole)
        return
    assert row["source"] == f"{books}, first {n:,} tokens" and row["tokens"] == n - 1
    assert (row["bytes"], row["documents"]) == ((n - 1, 1) if n <= 158 else (n - 2, 2))
    assert row["bits_per_byte"] == pytest.approx(
        math.log2(TOK.vocab_size) * row["tokens"] / row["bytes"], rel=1e-6
    )


def test_head_0_is_the_headline_and_the_mtp_mean_its_neighbour(tmp_path):
    """On one window of a random model: nats per token is head 0's mean loss alone (the
    other heads masked), and the MTP mean is the mean over heads of each head's mean loss,
    both from a forward of their own."""
    from euler.eval.text import Stream
    from euler.model.transformer import Model, make_targets

    ck = ckpt.load(_checkpoint(tmp_path / "r.safetensors", random=True))
    text = "The cat sat on the mat, and the dog ran to the river."
    stream = np.array([TOK.eot_id, *TOK.encode(text).tolist()], np.int32)
    row = evaluate_text(ck, [Stream("s", [stream], len(text), 1)], CpuBackend())["overall"]
    K, n = ck.cfg.n_mtp, len(stream) - 1
    model = Model(ck.cfg, CpuBackend(), flat_params=ck.params)
    window = stream[None, :]
    targets = make_targets(window, n, K, np.ones_like(window, np.uint8))  # (K, 1, n)
    model.forward(window[:, :n], targets, need_grad=False)
    losses = model.acts.losses.reshape(K, n).astype(np.float64)
    per_head = [losses[k][targets[k, 0] >= 0].mean() for k in range(K)]
    assert row["nats_per_token"] == pytest.approx(per_head[0], rel=1e-5)
    assert row["nats_per_token_mtp_mean"] == pytest.approx(np.mean(per_head), rel=1e-5)
    assert row["nats_per_token_mtp_mean"] != pytest.approx(row["nats_per_token"], rel=1e-3)


def test_a_long_context_scores_fewer_windows_a_forward(tmp_path):
    """At most max_tokens tokens a forward (an imported model's context of 2,048 would
    otherwise hold 16 windows' activations at once): the same windows, scored the same."""
    from euler.eval.text import EVAL_BATCH, Stream

    ck = ckpt.load(_checkpoint(tmp_path / "r.safetensors", random=True))
    T = ck.cfg.context
    stream = np.random.default_rng(0).integers(0, TOK.vocab_size, 9 * T + 1).astype(np.int32)
    src = [Stream("s", [stream], 9 * T, 1)]
    runs = {}
    for max_tokens in (EVAL_BATCH * T, 2 * T, T // 2):
        batches = []
        row = evaluate_text(ck, src, CpuBackend(), on_batch=batches.append,
                            max_tokens=max_tokens)["overall"]  # fmt: skip
        runs[max_tokens] = (batches, row)
    assert [b for b, _ in runs.values()] == [[9], [2, 2, 2, 2, 1], [1] * 9]
    rows = [r for _, r in runs.values()]
    assert {r["tokens"] for r in rows} == {9 * T}
    for r in rows[1:]:
        assert r["nats_per_token"] == pytest.approx(rows[0]["nats_per_token"], rel=1e-6)


def test_prepared_folder_scores_its_val_split_as_its_text(tmp_path):
    """A prepared folder's val split scores as its held-out documents given as text do:
    with the folder's tokenizer (its shards as they are) and with another (decoded and
    encoded again)."""
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and ran to the red house by the river".split()
    docs = [" ".join(rng.choice(words, 40)) + "." for _ in range(30)]
    src = CorpusSource("books", lambda: iter(docs), [{"origin": "generated"}])
    prepare_corpus([src], tmp_path / "pre", vocab_size=290, val_fraction=0.3, seed=0)
    held = [d for d in docs if is_val(d, 0, 0.3)]
    (tmp_path / "val.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in held))
    folder_tok = Tokenizer.load(tmp_path / "pre" / "tokenizer.json")
    for tok in (folder_tok, TOK):
        ck = ckpt.load(_checkpoint(tmp_path / f"c{tok.vocab_size}.safetensors", tok=tok,
                                   random=True))  # fmt: skip
        res = [
            evaluate_text(ck, load_text([tmp_path / p], ck), CpuBackend())["overall"]
            for p in ("pre", "val.jsonl")
        ]
        assert res[0]["documents"] == len(held) > 0
        for key in ("tokens", "bytes", "documents"):
            assert res[0][key] == res[1][key]
        assert res[0]["bits_per_byte"] == pytest.approx(res[1]["bits_per_byte"], rel=1e-12)
    assert res[0]["tokens"] == sum(len(d) for d in held) + len(held) - 1  # TOK: one a byte


def test_instruction_metrics_by_hand(tmp_path, monkeypatch, capsys):
    records = [
        {"instruction": "Say a.", "input": "", "output": "a a"},
        {"instruction": "Other.", "input": "x", "output": "b"},
    ]
    (tmp_path / "i.json").write_text(json.dumps(records))
    loops = _checkpoint(tmp_path / "loop.safetensors", _alternating)
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "eval",
        "--checkpoint",
        str(loops),
        "--instructions",
        str(tmp_path / "i.json"),
        "--max-tokens",
        "64",
        "--json",
        str(tmp_path / "loop.json"),
    )
    assert code == 0, err
    s = json.loads((tmp_path / "loop.json").read_text())["instructions"]
    assert s["answers"][0]["answer"] == "a " * 32
    assert (s["ended_share"], s["mean_tokens"], s["loop_share"]) == (0.0, 64.0, 1.0)
    # 32 words against "a a": LCS 2, precision 2/32, recall 1; against "b": nothing
    assert s["rouge_l"] == pytest.approx((2 * (1 / 16) / (1 / 16 + 1)) / 2)
    assert s["rouge_l_budget"] == s["rouge_l"]  # both references within 64 tokens
    assert "a a a" in out and "[...]" in out  # answers shown, cut ones marked
    ends = _checkpoint(tmp_path / "end.safetensors", _ends_at_once)
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "eval",
        "--checkpoint",
        str(ends),
        "--instructions",
        str(tmp_path / "i.json"),
        "--json",
        str(tmp_path / "end.json"),
    )
    s = json.loads((tmp_path / "end.json").read_text())["instructions"]
    assert (s["ended_share"], s["mean_tokens"], s["loop_share"], s["rouge_l"]) == (1, 0, 0, 0)


def test_overlap_against_the_references_budget(tmp_path, monkeypatch, capsys):
    """rouge_l_budget scores an answer against its reference's first --max-tokens tokens (one
    a byte here): at 8 tokens the answer "a a a a " against "a a a a " is 1, against the
    whole 14-word reference LCS 4, precision 1, recall 4/14: F1 8/18."""
    (tmp_path / "i.json").write_text(
        json.dumps([{"instruction": "Say a.", "input": "", "output": "a " * 10 + "b b b b"}])
    )
    loops = _checkpoint(tmp_path / "loop.safetensors", _alternating)
    args = (
        "eval",
        "--checkpoint",
        str(loops),
        "--instructions",
        str(tmp_path / "i.json"),
        "--max-tokens",
        "8",
    )
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json", str(tmp_path / "b.json"))
    assert code == 0, err
    s = json.loads((tmp_path / "b.json").read_text())["instructions"]
    assert s["answers"][0]["answer"] == "a " * 4
    assert s["rouge_l_budget"] == pytest.approx(1.0)
    assert s["rouge_l"] == pytest.approx(8 / 18)
    assert "1.0000" in out and "0.4444" in out  # both in the table


def test_loop_and_overlap_scores():
    assert has_loop("go on and on and on and on and on") and not has_loop("a b c d a b c d")
    assert has_loop("x y z w " * 3) and not has_loop("Hello, hello, hello.")
    assert rouge_l("The cats sat", "the cat sat down") == pytest.approx(2 * 1 * 0.75 / 1.75)


EVAL = ("eval", "--checkpoint", "{root}/c.safetensors")  # every case scores the uniform checkpoint
CASES = [
    Case("eval-nothing", EVAL, ("--text", "--instructions")),
    Case(
        "eval-not-alpaca",
        (*EVAL, "--instructions", "{root}/i.json"),
        ("i.json", "[0]", "record object"),
        lambda r: (r / "i.json").write_text('["just a string"]'),
    ),
    Case(
        "eval-alpaca-no-output",
        (*EVAL, "--instructions", "{root}/i.json"),
        ("i.json", "[0].output"),
        lambda r: (r / "i.json").write_text('[{"instruction": "a"}]'),
    ),
    Case(
        "eval-empty-folder",
        (*EVAL, "--text", "{root}/empty"),
        ("empty", "no files"),
        lambda r: (r / "empty").mkdir(),
    ),
    Case(
        "eval-empty-text",
        (*EVAL, "--text", "{root}/e.txt"),
        ("e.txt", "no document"),
        lambda r: (r / "e.txt").write_text("  \n"),
    ),
    Case(
        "eval-not-utf8",
        (*EVAL, "--text", "{root}/b.txt"),
        ("b.txt", "not UTF-8", "byte 3"),
        lambda r: (r / "b.txt").write_bytes(b"abc\xff"),
    ),
    Case(
        "eval-missing-text",
        (*EVAL, "--text", "{root}/none.txt"),
        ("--text", "none.txt", "not found"),
    ),
    Case(
        "eval-max-tokens",
        (*EVAL, "--instructions", "{root}/i.json", "--max-tokens", "0"),
        ("--max-tokens",),
    ),
    Case(
        "eval-text-tokens",
        (*EVAL, "--text", "{root}/t.txt", "--text-tokens", "-1"),
        ("--text-tokens must be an integer in [0,",),
        lambda r: (r / "t.txt").write_text("hi."),
    ),
    Case(
        "eval-text-tokens-one",
        (*EVAL, "--text", "{root}/t.txt", "--text-tokens", "1"),
        ("--text-tokens 1 predicts nothing",),
        lambda r: (r / "t.txt").write_text("hi."),
    ),
    Case(
        "eval-json-exists",
        (*EVAL, "--text", "{root}/t.txt", "--json", "{root}/t.txt"),
        ("--json", "--overwrite"),
        lambda r: (r / "t.txt").write_text("hi."),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_one_line(case, tmp_path, monkeypatch, capsys):
    _checkpoint(tmp_path / "c.safetensors")
    assert_refused(monkeypatch, capsys, case, tmp_path)


def test_tokenizer_larger_than_the_model_is_refused(tmp_path, monkeypatch, capsys):
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=TOK.vocab_size - 1)
    ckpt.save(
        tmp_path / "c.safetensors",
        cfg,
        np.zeros(ParamLayout(cfg).size, np.float32),
        None,
        {},
        {},
        TOK.to_json(),
    )
    (tmp_path / "t.txt").write_text("hi.")
    case = Case(
        "eval-vocab",
        ("eval", "--checkpoint", "{root}/c.safetensors", "--text", "{root}/t.txt"),
        ("c.safetensors", "tokenizer has", "cannot score"),
    )
    assert_refused(monkeypatch, capsys, case, tmp_path)
