"""Generation: the KV cache against full recomputation, speculative against greedy, sampling."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from euler.cpu.backend import CpuBackend
from euler.errors import EulerError
from euler.inference.decode_device import RecomputeDecoder
from euler.inference.generate import (
    ChatSession,
    Decoder,
    TextStream,
    generate,
    generate_speculative,
)
from euler.inference.sampling import SamplingConfig, sample
from euler.model.config import get_preset
from euler.model.transformer import Model

# a larger init spreads the logits, so greedy choices are far from ties and not all alike
CFG = dataclasses.replace(get_preset("tiny"), init_std=0.5)
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model(CFG, seed=11)


def _params(model: Model) -> np.ndarray:
    return model.be.to_host(model.params).copy()


def _uncached_greedy(model: Model, prompt: list[int], n: int) -> tuple[list[int], list]:
    """The reference: recompute the whole sequence for every new token."""
    seq, out, logits = list(prompt), [], []
    for _ in range(n):
        model.forward(np.array([seq], np.int32))
        row = model.head_logits(0)[0, -1]
        logits.append(row)
        out.append(int(np.argmax(row)))
        seq.append(out[-1])
    return out, logits


@pytest.mark.parametrize("prompt", [[3], [1, 2, 3, 4, 5], list(range(10, 30))])
def test_kv_cache_gives_the_tokens_of_full_recomputation(model, prompt):
    n = CFG.context - len(prompt) + 1  # up to a full context
    want, want_logits = _uncached_greedy(model, prompt, n)
    dec = Decoder(CFG, _params(model))
    got_logits = []
    res = generate(dec, prompt, n, GREEDY, on_token=lambda t: None)
    assert res.tokens == want and res.stop == "max"
    assert len(set(want)) > 3  # a real sequence, not one token repeated
    # and the logits agree to float32 rounding, position by position
    dec = Decoder(CFG, _params(model))
    h = dec.feed(prompt)[-1]
    for t in want[:-1]:
        got_logits.append(dec.logits(h)[0])
        h = dec.feed([t])[0]
    np.testing.assert_allclose(got_logits, want_logits[:-1], rtol=1e-4, atol=1e-4)


def test_rows_do_not_depend_on_how_many_are_fed_together(model):
    """The property speculative decoding stands on: bit-identical hidden states."""
    tokens = list(range(5, 21))
    one = Decoder(CFG, _params(model))
    whole = one.feed(tokens)
    parts = Decoder(CFG, _params(model))
    pieces = [parts.feed(tokens[:7]), parts.feed(tokens[7:8]), parts.feed(tokens[8:])]
    assert np.concatenate(pieces).tobytes() == whole.tobytes()


def test_recompute_decoder_gives_the_kv_cache_tokens(model):
    """The decoder of `euler chat --device cuda` (full recompute), here on the CPU backend."""
    prompt, n = [4, 9, 2, 7], 14
    base = generate(Decoder(CFG, _params(model)), prompt, n, GREEDY)
    rec = generate(RecomputeDecoder(CFG, _params(model), CpuBackend()), prompt, n, GREEDY)
    assert rec.tokens == base.tokens and len(set(base.tokens)) > 3
    spec = generate_speculative(RecomputeDecoder(CFG, _params(model), CpuBackend()), prompt, n)
    assert spec.tokens == base.tokens
    tokens = list(range(5, 21))
    whole = RecomputeDecoder(CFG, _params(model), CpuBackend()).feed(tokens)
    parts = RecomputeDecoder(CFG, _params(model), CpuBackend())
    pieces = [parts.feed(tokens[:7]), parts.feed(tokens[7:8]), parts.feed(tokens[8:])]
    assert np.concatenate(pieces).tobytes() == whole.tobytes()
    with pytest.raises(EulerError, match="exceeds the context"):
        parts.feed(list(range(CFG.context)))


def test_context_is_enforced(model):
    dec = Decoder(CFG, _params(model))
    res = generate(dec, list(range(20)), 100, GREEDY)
    assert res.stop == "context" and len(res.tokens) == CFG.context - 20 + 1
    with pytest.raises(EulerError, match="exceeds the context"):
        Decoder(CFG, _params(model)).feed(list(range(CFG.context + 1)))
    with pytest.raises(EulerError, match="empty prompt"):
        generate(dec, [], 3, GREEDY)


@pytest.mark.parametrize("prompt", [[3], [7, 8, 9], list(range(12)), list(range(22))])
@pytest.mark.parametrize("max_new", [1, 5, 40])
def test_speculative_equals_greedy(model, prompt, max_new):
    stop = (17,)
    base = generate(Decoder(CFG, _params(model)), prompt, max_new, GREEDY, stop_ids=stop)
    spec = generate_speculative(Decoder(CFG, _params(model)), prompt, max_new, stop_ids=stop)
    assert spec.tokens == base.tokens and spec.stop == base.stop


def test_speculative_accepts_drafts_that_head_0_agrees_with():
    """A model whose every position predicts the same token with every head: all accepted."""
    m = Model(CFG, seed=2)
    p = m.p
    p["tok_emb"][:] = p["tok_emb"][0]  # every token looks alike, so every position does too
    p["mtp_heads"][1:] = p["mtp_heads"][0]
    params = _params(m)
    base = generate(Decoder(CFG, params), [1, 2], 20, GREEDY)
    spec = generate_speculative(Decoder(CFG, params), [1, 2], 20)
    assert spec.tokens == base.tokens and len(set(spec.tokens)) == 1
    assert spec.acceptance == 1.0 and spec.forward_calls == 5  # 4 tokens per forward
    assert base.forward_calls == 19
    for max_new in range(1, 9):  # the budget runs out part way through accepted guesses
        spec = generate_speculative(Decoder(CFG, params), [1, 2], max_new)
        assert spec.tokens == base.tokens[:max_new] and spec.stop == "max"


def test_sampling_filters():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 1.0, 2.5, -1.0], np.float32)
    assert sample(logits, GREEDY, rng) == 1
    assert sample(logits, SamplingConfig(1.0, top_k=1, top_p=1.0), rng) == 1
    assert sample(logits, SamplingConfig(1.0, top_k=0, top_p=0.01), rng) == 1
    draws = [sample(logits, SamplingConfig(1.0, top_k=2, top_p=1.0), rng) for _ in range(300)]
    assert set(draws) == {1, 3}  # only the two likeliest, both drawn
    # top-p 0.9: the likeliest tokens up to 90% of the mass (here 1, 3, 2), never 0 or 4
    draws = [sample(logits, SamplingConfig(1.0, top_k=0, top_p=0.9), rng) for _ in range(300)]
    assert set(draws) == {1, 2, 3}
    again = [sample(logits, SamplingConfig(0.7), np.random.default_rng(5)) for _ in range(2)]
    assert again[0] == again[1]  # a seed fixes the draw
    with pytest.raises(EulerError, match="top-p"):
        SamplingConfig(top_p=0.0)
    # the draw is NumPy's own choice from the filtered softmax, for the same generator
    for seed in range(20):
        sc = SamplingConfig(0.9, top_k=seed % 3 * 2, top_p=1.0 - seed % 4 / 10)
        mine, ref = np.random.default_rng(seed), np.random.default_rng(seed)
        logits = np.random.default_rng(99 + seed).standard_normal(50).astype(np.float32)
        z = logits.astype(np.float64) / 0.9
        for _ in range(10):
            order = np.argsort(-z, kind="stable")
            order = order[: sc.top_k] if sc.top_k else order
            q = np.exp(z[order] - z[order[0]])
            q /= q.sum()
            if sc.top_p < 1.0:
                keep = int(np.searchsorted(np.cumsum(q), sc.top_p)) + 1
                order, q = order[:keep], q[:keep] / q[:keep].sum()
            assert sample(logits, sc, mine) == int(order[ref.choice(len(order), p=q)])


class _Bytes:
    """A stand-in tokenizer whose tokens are given byte strings."""

    def __init__(self, pieces):
        self.pieces = pieces

    def token_bytes(self, i):
        return self.pieces[i]


def test_text_stream_holds_back_half_a_character():
    euro = "€".encode()  # 3 bytes, split over two tokens
    stream = TextStream(_Bytes([b"a ", euro[:2], euro[2:] + b"!"]))
    assert [stream.push(0), stream.push(1), stream.push(2)] == ["a ", "", "€!"]
    assert stream.flush() == ""


class _Tok:
    user_id, assistant_id, end_id, eot_id = 57, 58, 59, 56

    def encode(self, text):
        return np.array([ord(c) % 50 for c in text], np.int32)


def test_chat_long_prompt_rule_and_cache_reuse(model):
    dec = Decoder(CFG, _params(model))
    chat = ChatSession(dec, _Tok())
    # context 24, max_tokens 6: the prompt may use 18 tokens; this one has 3 + 30
    res, cut = chat.reply("x" * 30, 6, GREEDY, np.random.default_rng(0))
    seq = chat.last_context
    assert cut and len(seq) == 18 and seq[0] == 57 and seq[-2:] == [59, 58]
    assert len(res.tokens) <= 6
    # a short second turn: the first (long) turn no longer fits, so it is dropped whole
    chat.reply("hi", 6, GREEDY, np.random.default_rng(0))
    assert chat.last_context == [57, ord("h") % 50, ord("i") % 50, 59, 58]
    # a third short turn keeps the second before it, and the cache is reused, not refilled
    fed, feed = [], dec.feed
    dec.feed = lambda tokens: fed.append(len(tokens)) or feed(tokens)
    chat.reply("yo", 4, GREEDY, np.random.default_rng(0))
    assert chat.last_context[:5] == [57, ord("h") % 50, ord("i") % 50, 59, 58]
    assert fed[0] < len(chat.last_context)  # the cached turn is not fed again
    chat.reset()
    assert dec.length == 0 and chat.turns == []
