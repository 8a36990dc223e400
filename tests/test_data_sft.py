"""SFT: Alpaca loading and errors, the chat template, masks, the too-long rule, batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from euler.tokenizer import Tokenizer

from euler.data.chat_template import encode_example, encode_prompt, render
from euler.data.sft import SFTDataset, load_alpaca, prepare_sft
from euler.errors import EulerError

RECORDS = [
    {"instruction": "Name a color.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The sum is 5."},
    {"instruction": "Say hello " * 40, "input": "", "output": "Hello."},  # prompt too long
    {"instruction": "Tell a story.", "input": "", "output": "Once upon a time " * 30},  # truncated
] + [{"instruction": f"Repeat {i}.", "input": "", "output": f"{i} {i} {i}"} for i in range(40)]


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


def test_prepare_sft_rule_counts_and_masks(tok, alpaca, tmp_path):
    m = prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=48, val_fraction=0.2, seed=0)
    splits = m["splits"]
    assert m["records"] == len(RECORDS)
    assert sum(s["kept"] + s["dropped"] for s in splits.values()) == len(RECORDS)
    assert sum(s["dropped"] for s in splits.values()) == 1
    assert sum(s["truncated"] for s in splits.values()) == 1
    for split in ("train", "val"):
        data = SFTDataset(tmp_path / "sft", split)
        assert len(data) == splits[split]["kept"]
        for i in range(len(data)):
            lo, hi = data.offsets[i], data.offsets[i + 1]
            ids, mask = np.asarray(data.tokens[lo:hi]), np.asarray(data.mask[lo:hi])
            assert len(ids) <= 49 and ids[0] == tok.user_id
            response = tok.decode(ids[mask == 1])
            rec = next(r for r in RECORDS if tok.decode(ids).startswith(render(**r)[:20]))
            if len(ids) < 49:
                assert response == rec["output"].strip() + "<|end|>"
            else:  # cut: a prefix of the response, no closing <|end|>
                assert (rec["output"].strip() + "<|end|>").startswith(response)


def test_sft_batches_pad_and_mask_and_are_deterministic(tok, alpaca, tmp_path):
    prepare_sft([str(alpaca)], tmp_path / "sft", tok, context=48, val_fraction=0.2)
    data = SFTDataset(tmp_path / "sft", "train", vocab_size=tok.vocab_size)
    tokens, mask = data.batch(step=5, seed=1, B=8, T=48, K=4)
    assert tokens.shape == mask.shape == (8, 52) and tokens.dtype == np.int32
    assert mask.dtype == np.uint8
    again = SFTDataset(tmp_path / "sft", "train").batch(step=5, seed=1, B=8, T=48, K=4)
    np.testing.assert_array_equal(again[0], tokens)
    np.testing.assert_array_equal(again[1], mask)
    assert np.all(mask[tokens == tok.eot_id] == 0)  # padding never counts
    assert np.all(mask[:, 0] == 0) and np.all(mask.sum(axis=1) > 0)
    rows = list(data.iter_sequential(B=16, T=48, K=4))
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
