"""Batched KV-cache decoding: each sequence of a batch gets exactly what it gets alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from euler.errors import EulerError
from euler.inference.batch import BatchDecoder
from euler.inference.engine import BatchGenerator, GenRequest, generate_batch
from euler.inference.generate import Decoder, generate
from euler.inference.sampling import SamplingConfig
from euler.model.config import get_preset
from euler.model.transformer import Model

# a larger init spreads the logits, so greedy choices are far from ties and not all alike
CFG = dataclasses.replace(get_preset("tiny"), init_std=0.5)
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def params() -> np.ndarray:
    m = Model(CFG, seed=11)
    return m.be.to_host(m.params).copy()


def _alone(params, req: GenRequest):
    """The reference: the request decoded by itself on a one-slot Decoder."""
    return generate(Decoder(CFG, params), list(req.prompt), req.max_new, req.sampling,
                    np.random.default_rng(req.seed), req.stop_ids)  # fmt: skip


REQUESTS = [
    GenRequest((3,), 30),
    GenRequest(tuple(range(1, 6)), 7, stop_ids=(115,)),  # stops after 4 tokens
    GenRequest(tuple(range(10, 30)), 10),  # 20 + 10 > context 24: ends on "context"
    GenRequest((5, 9), 1),
    GenRequest((2, 4, 6, 8), 12, SamplingConfig(0.9, top_k=20, top_p=0.9), seed=7),
    GenRequest((7, 7, 7), 15, SamplingConfig(1.3, top_k=0, top_p=1.0), seed=3, stop_ids=(306,)),
    GenRequest(tuple(range(40, 64)), 5),  # a full context: one token, then "context"
]


@pytest.mark.parametrize("slots, chunk", [(3, 0), (8, 5)])
def test_batched_decoding_gives_each_sequence_its_tokens_alone(params, slots, chunk):
    """Greedy and sampled (same seed), with sequences of different lengths joining and
    leaving the batch as slots free up, whole prompts or prompts fed 5 tokens a step."""
    got = generate_batch(BatchDecoder(CFG, params, slots), REQUESTS, chunk)
    for req, res in zip(REQUESTS, got, strict=True):
        want = _alone(params, req)
        assert (res.tokens, res.stop) == (want.tokens, want.stop), req
    assert {r.stop for r in got} == {"max", "context", "end"}
    assert len({tuple(r.tokens) for r in got}) == len(got)  # real, different sequences


def test_batched_rows_are_bit_identical_to_rows_fed_alone(params):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CFG.vocab_size, n) for n in (9, 1, 14)]
    batch = BatchDecoder(CFG, params, 4)
    together = batch.feed([(3, prompts[0]), (0, prompts[1]), (1, prompts[2])])
    steps = batch.feed([(1, [5]), (3, [6])])  # a decoding step of two of them
    for p, t, step in zip(prompts, together, ((6, 1), None, (5, 0)), strict=True):
        dec = Decoder(CFG, params)
        assert dec.feed(p).tobytes() == t.tobytes()
        if step:
            assert dec.feed([step[0]]).tobytes() == steps[step[1]].tobytes()
    assert batch.lengths == [1, 15, 0, 10]
    lone = Decoder(CFG, params)
    h = lone.feed(prompts[0])
    heads = batch.logits(np.concatenate([together[2], together[0]]), 2)
    assert heads[-len(h) :].tobytes() == lone.logits(h, 2).tobytes()


def test_slots_are_freed_and_bad_requests_refused(params):
    gen = BatchGenerator(BatchDecoder(CFG, params, 2))
    a = gen.add(GenRequest((1, 2), 50))
    gen.add(GenRequest((3,), 50))
    with pytest.raises(EulerError, match="all 2 slots are busy"):
        gen.add(GenRequest((4,), 5))
    assert {e.seq for e in gen.step()} == {0, 1}
    gen.cancel(a)
    assert gen.free_slots == 1 and gen.active == 1
    c = gen.add(GenRequest((1, 2), 3))  # a's slot, cleared: its tokens are a's again
    events = [e for _ in range(3) for e in gen.step() if e.seq == c]
    want = _alone(params, GenRequest((1, 2), 3))
    assert [e.token for e in events] == want.tokens and events[-1].finished == "max"
    for bad, match in [
        (GenRequest((), 3), "prompt: 0 tokens"),
        (GenRequest(tuple(range(CFG.context + 1)), 3), "expected 1 to 24"),
        (GenRequest((CFG.vocab_size,), 3), "token ids must be in"),
        (GenRequest((1,), 0), "max_new must be at least 1"),
    ]:
        with pytest.raises(EulerError, match=match):
            gen.add(bad)
    with pytest.raises(EulerError, match="distinct"):
        BatchDecoder(CFG, params, 2).feed([(0, [1]), (0, [2])])
    with pytest.raises(EulerError, match="slots must be an integer"):
        BatchDecoder(CFG, params, 0)


def test_the_thread_count_changes_no_bit_and_is_restored(params):
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    feeds = [(0, list(range(1, 12))), (1, [4])]
    one = BatchDecoder(CFG, params, 2).feed(feeds)
    many = BatchDecoder(CFG, params, 2, threads=most).feed(feeds)
    assert [a.tobytes() for a in one] == [b.tobytes() for b in many]
    assert numba.get_num_threads() == most  # the caller's own setting, back after the call
    with pytest.raises(EulerError, match="threads must be in"):
        BatchDecoder(CFG, params, 1, threads=most + 1)


def test_a_feed_runs_the_training_forward_with_a_cache(monkeypatch, params):
    """One schedule: the decoder has no forward of its own, each feed is one Model.layers
    over all its rows with a KV cache, and its hidden rows are the training forward's."""
    calls = []
    real = Model.layers

    def spy(self, a, cache=None):
        calls.append((a.T, cache is not None))
        real(self, a, cache)

    monkeypatch.setattr(Model, "layers", spy)
    dec = BatchDecoder(CFG, params, 2)
    rows = dec.feed([(0, [1, 2, 3]), (1, [4])])
    assert calls == [(4, True)]
    model = Model(CFG, flat_params=params)
    model.forward(np.array([[1, 2, 3]]))
    np.testing.assert_allclose(rows[0], model.be.to_host(model.acts.xf), rtol=1e-5, atol=1e-5)
