"""The thread that owns the model: requests wait in a bounded queue for a slot of one
BatchGenerator, and every step advances all the running ones by a token.

The web server's event loop submits a Generation with a sink (a function it can be called
with from this thread) and gets a Job back; the sink receives Delta pieces of text, then a
Done or a Failed. Tokens become text here (UTF-8 held back until whole, as the chat's
TextStream does), and stop strings are matched here too, holding back any text that may
begin one: a request whose stop string appears ends at once and frees its slot for the
next in the queue. cancel() (a client gone) frees a slot before the next step.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from euler.errors import EulerError
from euler.inference.batch import BatchDecoder
from euler.inference.engine import BatchGenerator, Event, GenRequest
from euler.inference.generate import TextStream
from euler.serve.protocol import Generation, special_ids


@dataclass(frozen=True)
class Delta:
    """The next piece of a request's text."""

    text: str


@dataclass(frozen=True)
class Done:
    """A request's end: finish_reason "stop" (a stop token or string) or "length"."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    """A request the model could not answer (the message says why)."""

    message: str


class Busy(Exception):
    """Every slot is taken and the queue is full."""


FINISH = {"end": "stop", "max": "length", "context": "length"}


class Job:
    """One request's state on the scheduler thread."""

    def __init__(self, gen: Generation, tok, sink: Callable[[object], None],
                 hidden: frozenset[int] = frozenset()):  # fmt: skip
        self.gen, self.sink = gen, sink
        self.hidden = hidden  # special tokens: counted, never shown as text
        self.seq: int | None = None  # its BatchGenerator sequence, once it has a slot
        self.tokens = 0
        self.over = False
        self._text = TextStream(tok)
        self._held = ""  # text not sent yet: it may be the start of a stop string

    def push(self, token: int) -> bool:
        """Take a generated token; True if a stop string ended the request."""
        self.tokens += 1
        if token in self.hidden:
            return False
        return self._send(self._held + self._text.push(token), final=False)

    def finish(self, why: str) -> None:
        """The generator ended the request ("end", "max" or "context")."""
        if not self._send(self._held + self._text.flush(), final=True):
            self._end(FINISH[why])

    def _send(self, text: str, final: bool) -> bool:
        cut = min((i for i in (text.find(s) for s in self.gen.stop) if i >= 0), default=-1)
        if cut >= 0:
            if cut:
                self.sink(Delta(text[:cut]))
            self._end("stop")
            return True
        keep = 0 if final else _stop_prefix(text, self.gen.stop)
        self._held = text[len(text) - keep :]
        if len(text) > keep:
            self.sink(Delta(text[: len(text) - keep]))
        return False

    def fail(self, message: str) -> None:
        self.over = True
        self.sink(Failed(message))

    def _end(self, reason: str) -> None:
        self.over = True
        self.sink(Done(reason, len(self.gen.prompt), self.tokens))


def _stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of text that begins some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[len(text) - k :]):
                best = k
                break
    return best


class Scheduler:
    """Runs dec on a thread of its own for submitted Generations (see the module docstring).

    max_queue: requests that may wait for a slot (beyond: Busy). prefill_chunk: prompt
    tokens a request feeds a step (0: all), bounding the delay a new prompt causes the
    others.
    """

    def __init__(self, dec: BatchDecoder, tok, max_queue: int = 64, prefill_chunk: int = 0):
        self.tok, self.max_queue = tok, max_queue
        self._hidden = special_ids(tok)
        self.gen = BatchGenerator(dec, prefill_chunk)
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._jobs: dict[int, Job] = {}  # running: sequence id -> job
        self._cancelled: list[Job] = []
        self._dropped = 0  # requests cancelled before their end (their clients left)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="euler-scheduler", daemon=True)
        self._thread.start()

    def submit(self, gen: Generation, sink: Callable[[object], None]) -> Job:
        """Queue gen; sink is called from the scheduler thread. Busy if the queue is full."""
        job = Job(gen, self.tok, sink, self._hidden)
        with self._cv:
            # a cancelled job's slot is free before the next step; free_slots may grow
            # under us as a step ends sequences (a late count only refuses a request that
            # would just have fitted)
            free = self.gen.free_slots + len(self._cancelled)
            if len(self._queue) - free >= self.max_queue:
                raise Busy(f"all {self.gen.dec.slots} slots are busy and {self.max_queue} "
                           "requests are waiting; try again later")  # fmt: skip
            self._queue.append(job)
            self._cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        """Drop job (its client is gone): out of the queue now, out of its slot before the
        next step. Nothing more reaches its sink."""
        with self._cv:
            if job.over:  # answered already
                return
            job.over = True
            self._dropped += 1
            if job in self._queue:
                self._queue.remove(job)
            elif job.seq is not None:
                self._cancelled.append(job)
                self._cv.notify()

    def stats(self) -> dict:
        """{"slots", "active", "queued", "cancelled"}: the batch's size and use now, and
        the requests cancelled before their end so far (clients that went away)."""
        with self._cv:
            return {"slots": self.gen.dec.slots, "active": len(self._jobs),
                    "queued": len(self._queue), "cancelled": self._dropped}  # fmt: skip

    def close(self) -> None:
        """Stop the thread after its current step; requests still open fail."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def _admit(self) -> bool:
        """Under the lock: drop cancelled jobs, start queued ones in free slots; whether
        the thread is to go on."""
        while not (self._closed or self._queue or self._cancelled or self._jobs):
            self._cv.wait()
        for job in self._cancelled:
            if self._jobs.pop(job.seq, None) is not None:
                self.gen.cancel(job.seq)
        self._cancelled.clear()
        while self._queue and self.gen.free_slots:
            job = self._queue.popleft()
            g = job.gen
            try:
                job.seq = self.gen.add(GenRequest(g.prompt, g.max_tokens, g.sampling, g.seed,
                                                  g.stop_ids))  # fmt: skip
            except EulerError as e:
                job.fail(str(e))
                continue
            self._jobs[job.seq] = job
        if self._closed:
            for job in [*self._jobs.values(), *self._queue]:
                job.fail("the server is shutting down")
        return not self._closed

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._admit():
                    return
            try:
                events = self.gen.step()
            except Exception as e:  # e.g. NaN logits: no token can be chosen
                with self._cv:
                    for seq, job in self._jobs.items():
                        self.gen.cancel(seq)
                        job.fail(str(e))
                    self._jobs.clear()
                continue
            with self._cv:
                for ev in events:
                    self._deliver(ev)

    def _deliver(self, ev: Event) -> None:
        """Under the lock: hand one step's event of a running job to its sink."""
        job = self._jobs.get(ev.seq)
        if job is None or job.over:  # cancelled during the step
            return
        if ev.token is not None and job.push(ev.token):  # a stop string
            self.gen.cancel(ev.seq)
            del self._jobs[ev.seq]
        elif ev.finished:
            job.finish(ev.finished)
            del self._jobs[ev.seq]
