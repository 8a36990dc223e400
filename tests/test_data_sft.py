"""SFT: Alpaca loading and errors, the chat template, masks, the long-record policy,
packing (no target crosses a record, every <|end|> is a target), batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.data.chat_template import encode_example, encode_prompt, render
from euler.data.sft import HELDOUT_FILE, SFTDataset, load_alpaca, prepare_sft
from euler.data.sft_policy import classify, cut_response, pack_windows, sentence_ends
from euler.errors import EulerError
from euler.model.transformer import make_targets

RECORDS = [
    {"instruction": "Name a color.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The sum is 5."},
    {"instruction": "Say hello " * 40, "input": "", "output": "Hello."},  # prompt too long
    {"instruction": "Tell a story.", "input": "", "output": "Once upon a time " * 30},  # no "."
    {"instruction": "Describe it.", "input": "", "output": "The sky is blue. " * 12},  # cut
    {"instruction": "", "input": "", "output": "Yes."},  # a 3-token prompt
] + [{"instruction": f"Repeat {i}.", "input": "", "output": f"{i} {i} {i}"} for i in range(40)]
# (long rule, pack) -> records dropped, cut and truncated
POLICIES = {("cut", True): (2, 1, 0), ("truncate", False): (1, 0, 2), ("drop", False): (3, 0, 0)}


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    sample = tmp_path_factory.mktemp("tok") / "sample.txt"
    sample.write_text(json.dumps(RECORDS) * 5)
    return Tokenizer.train([sample], 320)


@pytest.fixture(scope="module")
def alpaca(tmp_path_factory):
    path = tmp_path_factory.mktemp("sft") / "alpaca.json"
    path.write_text(json.dumps(RECORDS, indent=2))
    return path


def test_template_text_and_mask_cover_exactly_the_response(tok):
    text = render("Add the numbers.", "2 and 3", " The sum is 5. ")
    assert text == "<|user|>Add the numbers.\n\n2 and 3<|end|><|assistant|>The sum is 5.<|end|>"
    ids, mask = encode_example(tok, "Add the numbers.", "2 and 3", " The sum is 5. ")
    assert tok.decode(ids) == text
    assert tok.decode(ids[mask == 1]) == "The sum is 5.<|end|>"
    assert tok.decode(ids[mask == 0]) == "<|user|>Add the numbers.\n\n2 and 3<|end|><|assistant|>"
    assert mask[-1] == 1 and ids[-1] == tok.end_id
    first = int(np.argmax(mask))
    assert np.all(mask[first:] == 1) and ids[first - 1] == tok.assistant_id
    prompt = encode_prompt(tok, "Name a color.")
    assert tok.decode(prompt) == "<|user|>Name a color.<|end|><|assistant|>"
    # a user typing a special token's text gets plain text, not the control token
    assert tok.end_id not in encode_prompt(tok, "say <|end|>")[1:-2]


@pytest.mark.parametrize(("long", "pack"), list(POLICIES))
def test_prepare_sft_policy_counts_and_records(tok, alpaca, tmp_path, long, pack):
    m = prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=48, val_fraction=0.2, seed=0,
                    long=long, pack=pack, max_answer=0)  # fmt: skip
    splits = m["splits"]
    assert m["records"] == len(RECORDS) and m["policy"] == {
        "long": long, "pack": pack, "max_answer": 0}  # fmt: skip
    total = {k: sum(s[k] for s in splits.values()) for k in ("dropped", "cut", "truncated")}
    assert (total["dropped"], total["cut"], total["truncated"]) == POLICIES[(long, pack)]
    assert sum(s["kept"] + s["dropped"] for s in splits.values()) == len(RECORDS)
    heldout = json.loads((tmp_path / "sft" / HELDOUT_FILE).read_text())
    assert len(heldout) == splits["val"]["records"] and all(r in RECORDS for r in heldout)
    for split in ("train", "val"):
        data = SFTDataset(tmp_path / "sft", split)
        assert len(data) == splits[split]["windows"] and len(data.starts) == splits[split]["kept"]
        if not pack:
            assert len(data) == splits[split]["kept"]
        ends = [*data.starts[1:], len(data.tokens)]
        for lo, hi in zip(data.starts, ends, strict=True):
            ids, mask = np.asarray(data.tokens[lo:hi]), np.asarray(data.mask[lo:hi])
            assert len(ids) <= 49 and ids[0] == tok.user_id
            response = tok.decode(ids[mask == 1])
            prompt = tok.decode(ids[mask == 0])  # ends with <|assistant|>: one record's
            rec = next(r for r in RECORDS if render(**r).startswith(prompt))
            whole = rec["output"].strip() + "<|end|>"
            if response.endswith("<|end|>") and response != whole:  # cut at a sentence end
                assert long == "cut" and whole.startswith(response[: -len("<|end|>")])
                assert response.endswith(".<|end|>")
            elif response != whole:  # truncated: a prefix of the response, no <|end|>
                assert long == "truncate" and len(ids) == 49 and whole.startswith(response)


def test_packed_targets_stay_inside_records_and_every_end_is_one(tok, alpaca, tmp_path):
    prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=48, val_fraction=0.0)
    data = SFTDataset(tmp_path / "sft")
    assert data.manifest["splits"]["train"]["records_per_window"] > 2
    K, crossing = 4, 0
    for tokens, mask, segments in data.iter_sequential(B=8, T=48, K=K):
        targets = make_targets(tokens, 48, K, mask, segments)
        for k in range(K):
            t = np.argwhere(targets[k] >= 0)
            b, t, j = t[:, 0], t[:, 1], t[:, 1] + 1 + k
            assert np.all(segments[b, t] == segments[b, j]) and np.all(mask[b, j] == 1)
        b, j = np.nonzero((tokens == tok.end_id) & (mask == 1))
        assert len(b) == (segments.max(axis=1) + 1).sum()  # one closing <|end|> per record
        assert np.all(targets[0, b, j - 1] == tok.end_id)  # ... and each is head 0's target
        crossing += int(((make_targets(tokens, 48, K, mask) >= 0) & (targets < 0)).sum())
    assert crossing > 0  # the 3-token prompt: without segments a target would cross


def test_sentence_ends_and_cut():
    text = "Here are tips:\n1. Eat well.\n2. Sleep (8 hours!) daily\nDone"
    cuts = [text[:i] for i in sentence_ends(text)]
    first = "Here are tips:\n1. Eat well."
    assert cuts == [first, first + "\n2. Sleep (8 hours!)", first + "\n2. Sleep (8 hours!) daily"]
    encode = lambda s: np.arange(len(s))  # one token a character
    assert [len(cut_response(text, n, encode)) for n in (50, 47, 46, 27)] == [47, 47, 27, 27]
    assert cut_response(text, 26, encode) is None


def test_max_answer_bounds_the_response_whatever_the_window_leaves():
    encode = lambda s: np.frombuffer(s.encode(), np.uint8).astype(np.int32)  # a token a byte
    text = "One two. Three four. Five."
    prompt, response = np.zeros(4, np.int32), np.append(encode(text), 99).astype(np.int32)
    kind, ids, mask = classify(prompt, response, text, 64, "cut", encode, 99, max_answer=0)
    assert kind == "whole" and len(ids) == 4 + len(text) + 1
    kind, ids, mask = classify(prompt, response, text, 64, "cut", encode, 99, max_answer=21)
    assert kind == "cut" and bytes(ids[4:-1].astype(np.uint8)) == b"One two. Three four."
    assert ids[-1] == 99 and mask.tolist() == [0] * 4 + [1] * 21
    kind, ids, _ = classify(prompt, response, text, 64, "truncate", encode, 99, max_answer=21)
    assert kind == "truncated" and len(ids) == 4 + 21 and 99 not in ids
    assert classify(prompt, response, text, 64, "drop", encode, 99, max_answer=21)[0] == "dropped"
    assert classify(prompt, response, text, 64, "cut", encode, 99, max_answer=8)[0] == "dropped"


def test_pack_windows_fill_and_cover():
    lengths = np.array([30, 20, 20, 10, 49, 5, 5])
    windows = pack_windows(lengths, 49, pack=True, seed=0)
    assert sorted(i for w in windows for i in w) == list(range(len(lengths)))
    assert all(sum(lengths[w]) <= 49 for w in windows) and len(windows) == 3
    assert sorted(map(tuple, pack_windows(lengths, 49, pack=False, seed=0))) == [
        (i,) for i in range(len(lengths))]  # fmt: skip


def test_sft_batches_pad_and_mask_and_are_deterministic(tok, alpaca, tmp_path):
    prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=48, val_fraction=0.2, pack=False)
    data = SFTDataset(tmp_path / "sft", "train", vocab_size=tok.vocab_size)
    tokens, mask, segments = data.batch(step=5, seed=1, B=8, T=48, K=4)
    assert tokens.shape == mask.shape == segments.shape == (8, 52) and tokens.dtype == np.int32
    assert mask.dtype == np.uint8
    again = SFTDataset(tmp_path / "sft", "train").batch(step=5, seed=1, B=8, T=48, K=4)
    for x, y in zip(again, (tokens, mask, segments), strict=True):
        np.testing.assert_array_equal(x, y)
    assert np.all(mask[tokens == tok.eot_id] == 0)  # padding never counts
    assert np.all(segments[tokens == tok.eot_id] == -1) and segments.max() == 0
    assert np.all(mask[:, 0] == 0) and np.all(mask.sum(axis=1) > 0)
    rows = list(data.iter_sequential(B=len(data) - 1, T=48, K=4))  # 1 window in the last
    seen = sum(int((r[0][:, 0] == tok.user_id).sum()) for r in rows)
    assert seen == len(data) and rows[-1][1][-1].sum() == 0  # last batch filled with padding


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[\n  {"instruction": "a",\n   "output": }\n]', r"bad\.json:3: invalid JSON"),
        ('{"instruction": "a"}', "expected a JSON list"),
        ('[{"instruction": "a", "input": ""}]', r"\[0\]\.output: expected a value, found nothing"),
        ('[{"instruction": "a", "output": 3}]', r"\[0\]\.output: expected a string, found 3"),
        ('[{"instruction": "a", "output": "b"}, 3]', r"\[1\]: expected a record object"),
    ],
)
def test_bad_alpaca_files(tmp_path, text, message):
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(EulerError, match=message):
        load_alpaca(tmp_path / "bad.json")


def test_missing_input_defaults_to_empty(tmp_path):
    (tmp_path / "a.json").write_text('[{"instruction": "a", "output": "b"}]')
    assert load_alpaca(tmp_path / "a.json") == [{"instruction": "a", "input": "", "output": "b"}]


def test_nothing_fits_and_missing_file(tok, alpaca, tmp_path):
    with pytest.raises(EulerError, match="no record fits a context of 3"):
        prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=3)
    with pytest.raises(EulerError, match="not found"):
        prepare_sft([str(tmp_path / "nope.json")], tmp_path / "sft", tok)
    assert not (tmp_path / "sft").exists()
    with pytest.raises(EulerError, match="no manifest.json"):
        SFTDataset(tmp_path)
