"""The serve scheduler in-process: stop strings cut the text where they begin (held back
while they might begin), a full queue refuses, a cancelled request frees its slot."""

from __future__ import annotations

import queue

import pytest

from euler.inference.batch import BatchDecoder
from euler.inference.sampling import SamplingConfig
from euler.serve.protocol import Generation
from euler.serve.scheduler import Busy, Delta, Done, Scheduler, _stop_prefix
from euler.training import checkpoint
from tests.serve_helpers import tiny_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    ck = checkpoint.load(tiny_checkpoint(tmp_path_factory.mktemp("sched") / "run", 512))
    return ck.cfg, ck.params, ck.tokenizer()


def _gen(tok, max_tokens: int, stop: tuple[str, ...] = ()) -> Generation:
    prompt = (tok.eot_id, *tok.encode("The sun").tolist())
    greedy = SamplingConfig(temperature=0.0)
    return Generation("text", prompt, max_tokens, greedy, 0, (tok.eot_id,), stop, True, False)


def _answer(sched: Scheduler, gen: Generation) -> tuple[str, Done]:
    got: queue.Queue = queue.Queue()
    sched.submit(gen, got.put)
    text = []
    while not isinstance(item := got.get(timeout=30), Done):
        assert isinstance(item, Delta), item
        text.append(item.text)
    return "".join(text), item


def test_stop_strings_cut_the_text_where_they_begin(model):
    cfg, params, tok = model
    sched = Scheduler(BatchDecoder(cfg, params, 2), tok)
    try:
        full, done = _answer(sched, _gen(tok, 40))
        assert done.finish_reason == "length" and done.completion_tokens == 40
        for stop in (full[5:8], full[12:13], full[-3:]):
            cut = full.find(stop)
            text, done = _answer(sched, _gen(tok, 40, ("never there", stop)))
            assert (text, done.finish_reason) == (full[:cut], "stop")
            assert done.completion_tokens < 40 or stop == full[-3:]
    finally:
        sched.close()


def test_a_full_queue_refuses_and_a_cancelled_request_frees_its_slot(model):
    cfg, params, tok = model
    sched = Scheduler(BatchDecoder(cfg, params, 1), tok, max_queue=0)
    try:
        got: queue.Queue = queue.Queue()
        job = sched.submit(_gen(tok, 500), got.put)  # a free slot: no waiting needed
        assert isinstance(got.get(timeout=30), Delta)
        with pytest.raises(Busy, match="1 slots are busy"):
            sched.submit(_gen(tok, 5), got.put)
        sched.cancel(job)
        _, done = _answer(sched, _gen(tok, 3))  # the slot is free again
        assert done.completion_tokens == 3
        assert sched.stats() == {"slots": 1, "active": 0, "queued": 0, "cancelled": 1}
    finally:
        sched.close()


def test_stop_prefix():
    assert _stop_prefix("xyab", ("abc",)) == 2
    assert _stop_prefix("xyab", ("b!", "yab?")) == 3
    assert _stop_prefix("xyz", ("abc",)) == 0
    assert _stop_prefix("", ("abc",)) == 0
