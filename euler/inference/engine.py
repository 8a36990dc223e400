"""Batched generation: every active sequence advances by one token per forward.

A BatchGenerator holds up to `slots` sequences in the cache slots of a BatchDecoder, each
with its own prompt, length, sampling settings, random generator, stop tokens and token
budget. step() runs one forward over all of them: the prompt of a newly added sequence
(up to prefill_chunk tokens of it a step) beside one token of each sequence that is
decoding, then one sample per sequence whose prompt is in. A finished or cancelled
sequence frees its slot at once, for the next add().

A sequence gets exactly the tokens that generate() gives it alone on a one-slot Decoder
with the same seed, greedy or sampled: its rows' hidden states and logits are bit-identical
whatever shares the batch (euler.inference.batch), and its generator draws once a token,
as generate()'s does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from euler.errors import EulerError
from euler.inference.batch import BatchDecoder
from euler.inference.generate import GenResult
from euler.inference.sampling import SamplingConfig, sample


@dataclass(frozen=True)
class GenRequest:
    """One sequence to generate: continue prompt (token ids) by up to max_new tokens,
    stopping before any of stop_ids; sampling drawn from a generator seeded by seed."""

    prompt: tuple[int, ...]
    max_new: int
    sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    seed: int = 0
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Event:
    """What one step did to sequence seq: the token it chose (None if it chose none: its
    prompt is still being fed, or it chose a stop token), and why it finished (None while
    it goes on; "end" a stop token, "max" max_new tokens, "context" the cache is full)."""

    seq: int
    token: int | None
    finished: str | None


@dataclass
class _Active:
    req: GenRequest
    slot: int
    rng: np.random.Generator
    pending: list[int]  # tokens to feed next: what is left of the prompt, or the last token
    produced: int = 0


class BatchGenerator:
    """Sequences decoded together in the slots of dec; see the module docstring.

    prefill_chunk: most prompt tokens of one sequence fed a step (0: the whole prompt), so
    that a long new prompt delays the other sequences' next token by at most that much.
    """

    def __init__(self, dec: BatchDecoder, prefill_chunk: int = 0):
        if (
            isinstance(prefill_chunk, bool)
            or not isinstance(prefill_chunk, int)
            or prefill_chunk < 0
        ):
            raise EulerError(f"prefill_chunk must be an integer at least 0, got {prefill_chunk!r}")
        self.dec, self.prefill_chunk = dec, prefill_chunk
        self._active: dict[int, _Active] = {}  # sequence id -> its state, in order of add()
        self._free = list(range(dec.slots - 1, -1, -1))  # a stack: slot 0 first
        self._next_id = 0

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def active(self) -> int:
        return len(self._active)

    def add(self, req: GenRequest) -> int:
        """Start req in a free slot; its id for step()'s events and cancel(). EulerError
        when no slot is free, or when req cannot run (empty or too long a prompt, ids out
        of the vocabulary, max_new under 1)."""
        cfg = self.dec.cfg
        if not self._free:
            raise EulerError(f"all {self.dec.slots} slots are busy")
        if not 1 <= len(req.prompt) <= cfg.context:
            raise EulerError(f"prompt: {len(req.prompt)} tokens, expected 1 to {cfg.context}")
        if min(req.prompt) < 0 or max(req.prompt) >= cfg.vocab_size:
            raise EulerError(f"prompt: token ids must be in [0, {cfg.vocab_size})")
        if req.max_new < 1:
            raise EulerError(f"max_new must be at least 1, got {req.max_new}")
        slot = self._free.pop()
        self.dec.truncate(slot, 0)
        seq, self._next_id = self._next_id, self._next_id + 1
        self._active[seq] = _Active(req, slot, np.random.default_rng(req.seed), list(req.prompt))
        return seq

    def cancel(self, seq: int) -> None:
        """Drop sequence seq (if it is still active) and free its slot."""
        a = self._active.pop(seq, None)
        if a is not None:
            self._free.append(a.slot)

    def step(self) -> list[Event]:
        """One forward over every active sequence; an Event for each (none if idle)."""
        if not self._active:
            return []
        feeds, fed = [], list(self._active)
        for a in self._active.values():
            n = min(self.prefill_chunk or len(a.pending), len(a.pending))
            feeds.append((a.slot, a.pending[:n]))
            a.pending = a.pending[n:]
        hidden = self.dec.feed(feeds)
        ready = [i for i, seq in enumerate(fed) if not self._active[seq].pending]
        events = [Event(seq, None, None) for seq in fed if self._active[seq].pending]
        if ready:  # one product for every sequence's next-token logits
            logits = self.dec.logits(np.stack([hidden[i][-1] for i in ready]))
            events += [self._choose(fed[i], row) for i, row in zip(ready, logits, strict=True)]
        return events

    def _choose(self, seq: int, logits: np.ndarray) -> Event:
        """Sample seq's next token from its logits (V,) and settle what comes after it."""
        a = self._active[seq]
        t = sample(logits, a.req.sampling, a.rng)
        if t in a.req.stop_ids:
            self.cancel(seq)
            return Event(seq, None, "end")
        a.produced += 1
        finished = None
        if a.produced == a.req.max_new:
            finished = "max"
        elif self.dec.lengths[a.slot] >= self.dec.cfg.context:
            finished = "context"
        if finished:
            self.cancel(seq)
        else:
            a.pending = [t]
        return Event(seq, t, finished)


def generate_batch(
    dec: BatchDecoder, requests: Sequence[GenRequest], prefill_chunk: int = 0
) -> list[GenResult]:
    """Every request generated to its end, up to dec.slots at a time (the others start as
    slots free up, in order); a GenResult (tokens and stop) each, in requests' order."""
    gen = BatchGenerator(dec, prefill_chunk)
    results = [GenResult([], "max") for _ in requests]
    index: dict[int, int] = {}  # sequence id -> request index
    waiting = list(range(len(requests)))[::-1]
    while waiting or gen.active:
        while waiting and gen.free_slots:
            i = waiting.pop()
            index[gen.add(requests[i])] = i
        for ev in gen.step():
            res = results[index[ev.seq]]
            if ev.token is not None:
                res.tokens.append(ev.token)
            if ev.finished:
                res.stop = ev.finished
    return results
