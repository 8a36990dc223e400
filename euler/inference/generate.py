"""Generation with a KV cache: plain (greedy or sampled) and self-speculative decoding.

The Decoder is one sequence's inference-only forward on a backend with a KV cache
(kv_cache: the CPU's), a one-slot euler.inference.batch.BatchDecoder: it keeps, per layer,
the keys (after RoPE) and values of every position fed so far, so feeding n new tokens
costs O(n * context) attention and O(n) everything else, instead of a full recompute of
the sequence. A backend without one decodes through
euler.inference.decode_device.RecomputeDecoder (make_decoder picks). Several sequences at
once, one token each a forward: euler.inference.engine.

Every per-row step (embedding, RMSNorm, RoPE, attention, SwiGLU) treats rows alone, and
the matrix products compute each row alone (decode_linear), so the hidden state of a
position is bit-identical whether it was fed alone or with others. That is what makes
speculative decoding produce exactly the greedy tokens.

Self-speculative decoding (blockwise parallel decoding, Stern et al. 2018): from the hidden
state of the last accepted position, head 0 gives the next token g for sure and heads
1..K-1 guess the K-1 tokens after it. Feeding [g, guesses] in one call yields head 0's
prediction after each of them; guesses are accepted while they equal those predictions.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from euler.backend import Backend
from euler.errors import EulerError
from euler.inference.batch import BatchDecoder
from euler.inference.sampling import SamplingConfig, greedy, sample
from euler.model.config import ModelConfig


class Decoder:
    """One sequence's decoding: a slot of a BatchDecoder (by default one of its own, on
    the CPU). feed and logits take and return host arrays; rows are computed as they are
    in any batch, so this sequence's tokens do not depend on what else the batch decodes."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: np.ndarray,
        dtype=np.float32,
        backend: Backend | None = None,
        threads: int = 1,
    ):
        self.batch, self.slot = BatchDecoder(cfg, params, 1, dtype, backend, threads), 0
        self.cfg = cfg

    @property
    def length(self) -> int:
        """Positions 0..length-1 are cached."""
        return self.batch.lengths[self.slot]

    def truncate(self, length: int) -> None:
        """Forget cached positions >= length (rejected speculative tokens, /reset)."""
        self.batch.truncate(self.slot, length)

    def feed(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Append n tokens at positions length..length+n-1; return their final hidden (n, D)."""
        return self.batch.feed([(self.slot, tokens)])[0]

    def logits(self, xf: np.ndarray, k: int = 0) -> np.ndarray:
        """Head k's logits (n, V) for hidden rows xf (n, D); head k predicts token t+1+k."""
        return self.batch.logits(xf, k)


@dataclass
class GenResult:
    """What a generation produced and how it went."""

    tokens: list[int]  # generated ids, without the stop token
    stop: str  # "end" (a stop token), "max" (max_new tokens) or "context" (cache full)
    seconds: float = 0.0  # after the prompt's prefill
    prefill_seconds: float = 0.0
    forward_calls: int = 0  # Decoder.feed calls after the prefill
    drafted: int = 0  # speculative: guesses fed for verification
    accepted: int = 0  # speculative: guesses that equalled head 0's choice

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def _start(dec: Decoder, prompt: Sequence[int]) -> tuple[np.ndarray, float]:
    """Feed the prompt after the cached positions; (last hidden row (D,), seconds)."""
    if len(prompt) == 0:
        raise EulerError("empty prompt: give at least one token")
    t0 = time.perf_counter()
    h = dec.feed(prompt)[-1]
    return h, time.perf_counter() - t0


def generate(
    dec: Decoder,
    prompt: Sequence[int],
    max_new: int,
    sampling: SamplingConfig,
    rng: np.random.Generator | None = None,
    stop_ids: Sequence[int] = (),
    on_token: Callable[[int], None] | None = None,
) -> GenResult:
    """Continue `prompt` (fed after whatever the cache holds) by up to max_new tokens.

    Stops before a token in stop_ids, after max_new tokens, or when the context is full;
    on_token(id) is called as each token is chosen (for streaming).
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    h, prefill = _start(dec, prompt)
    res = GenResult([], "max", prefill_seconds=prefill)
    t0 = time.perf_counter()
    while len(res.tokens) < max_new:
        t = sample(dec.logits(h)[0], sampling, rng)
        if t in stop_ids:
            res.stop = "end"
            break
        res.tokens.append(t)
        if on_token:
            on_token(t)
        if len(res.tokens) == max_new:
            break
        if dec.length >= dec.cfg.context:
            res.stop = "context"
            break
        h = dec.feed([t])[0]
        res.forward_calls += 1
    res.seconds = time.perf_counter() - t0
    return res


def generate_speculative(
    dec: Decoder,
    prompt: Sequence[int],
    max_new: int,
    stop_ids: Sequence[int] = (),
    on_token: Callable[[int], None] | None = None,
) -> GenResult:
    """Greedy decoding accelerated by the MTP heads; the same tokens as generate() greedy."""
    K, C = dec.cfg.n_mtp, dec.cfg.context
    h, prefill = _start(dec, prompt)
    res = GenResult([], "max", prefill_seconds=prefill)
    t0 = time.perf_counter()

    def emit(t: int) -> bool:
        """Take token t; True when generation is over."""
        if t in stop_ids:
            res.stop = "end"
            return True
        res.tokens.append(t)
        if on_token:
            on_token(t)
        return len(res.tokens) == max_new

    while len(res.tokens) < max_new:
        g = greedy(dec.logits(h)[0])
        if emit(g):
            break
        n = dec.length
        if n >= C:
            res.stop = "context"
            break
        # head k guesses the token k positions after g; feed g and the guesses that fit
        guesses = [greedy(dec.logits(h, k)[0]) for k in range(1, min(K, C - n))]
        hidden = dec.feed([g, *guesses])
        res.forward_calls += 1
        res.drafted += len(guesses)
        choice = greedy(dec.logits(hidden))  # head 0 after g, guess 1, ...
        j, over = 0, False  # j: guesses accepted
        while not over and j < len(guesses) and choice[j] == guesses[j]:
            over = emit(guesses[j])
            if res.stop != "end":  # a stop token ends the answer and is not part of it
                res.accepted += 1
                j += 1
        if over:
            break
        dec.truncate(n + 1 + j)  # keep g and the accepted guesses
        h = hidden[j]
    res.seconds = time.perf_counter() - t0
    return res


class TextStream:
    """Token ids -> text pieces for streaming: holds back bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._dec.decode(self.tok.token_bytes(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class ChatSession:
    """A conversation rendered with the chat template, reusing the KV cache across turns.

    Long-prompt rule (C = the model's context, R = room kept for the answer =
    min(max_tokens, C / 2)): the conversation fed to the model is the newest turns that fit
    in C - R tokens; older turns are dropped whole. A single turn longer than C - R keeps
    <|user|> and its last C - R - 1 tokens (the end of a prompt, where the question usually
    is, and the <|end|><|assistant|> tags). The answer stops at <|end|>, after max_tokens,
    or when the context is full.
    """

    def __init__(self, dec: Decoder, tokenizer):
        self.dec, self.tok = dec, tokenizer
        # finished turns: prompt ids + answer ids + the end token (+ ChatML's "\n")
        self.turns: list[list[int]] = []
        self._fed: list[int] = []  # the tokens whose keys/values the cache holds, in order
        self.last_context: list[int] = []  # the sequence the last answer continued

    def reset(self) -> None:
        self.turns, self._fed = [], []
        self.dec.truncate(0)

    def context_for(self, prompt: np.ndarray, max_tokens: int) -> tuple[list[int], bool]:
        """The token sequence to continue for a new turn's prompt ids, and whether it was cut."""
        C = self.dec.cfg.context
        budget = C - max(1, min(max_tokens, C // 2))
        prompt = [int(t) for t in prompt]
        if len(prompt) > budget:
            return [prompt[0], *prompt[len(prompt) - budget + 1 :]], True
        seq = prompt
        for turn in reversed(self.turns):
            if len(turn) + len(seq) > budget:
                break
            seq = turn + seq
        return seq, False

    def reply(
        self,
        instruction: str,
        max_tokens: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        speculative: bool = False,
        on_token: Callable[[int], None] | None = None,
    ) -> tuple[GenResult, bool]:
        """Answer one user turn; (the generation, whether the prompt was cut to fit)."""
        from euler.data import encode_prompt
        from euler.data.chat_template import turn_gap

        # the template's system block opens a conversation (ChatML; ours has none)
        prompt = encode_prompt(self.tok, instruction, system=not self.turns)
        seq, cut = self.context_for(prompt, max_tokens)
        self.last_context = seq
        # reuse the cached prefix that this sequence shares with what was fed before
        same = 0
        # (at least one token is fed, to get the hidden state the answer starts from)
        for a, b in zip(self._fed, seq[:-1], strict=False):
            if a != b:
                break
            same += 1
        self.dec.truncate(same)
        self._fed = self._fed[:same]  # true even if this answer is interrupted (Ctrl-C)
        stop = (self.tok.end_id, self.tok.eot_id)
        if speculative:
            res = generate_speculative(self.dec, seq[same:], max_tokens, stop, on_token)
        else:
            res = generate(self.dec, seq[same:], max_tokens, sampling, rng, stop, on_token)
        self._fed = (seq + res.tokens)[: self.dec.length]
        self.turns.append(prompt.tolist() + res.tokens + [self.tok.end_id, *turn_gap(self.tok)])
        return res, cut
