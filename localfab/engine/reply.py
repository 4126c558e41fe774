"""One reply's token step, the same for every way of decoding.

`ReplyState` owns what happens to a reply from its first token to its Done: pick the token from
a row of logits (the sampler chain, or argmax for plain greedy), accept it, detokenize it
through the UTF-8 and stop-string filters, report its probabilities, decide whether the reply
ends, and build the Done. The single-sequence loop (`generation.stream`), the speculative
verify (`spec.loop`) and the batched slots (`batch`) hold one each and call `step` for every
position they have logits for; none of them handles a token itself, so whatever follows the
text (a stop string, a parser that splits reasoning or tool calls out of it) is added here once
and works on all three.

The helpers around it set a request up (`check_request`, `new_sampler`) and make room when the
window fills (`make_room`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import llama_cpp as lc
import numpy as np

from localfab.engine.sampling import GuardedSampler, is_fast_greedy
from localfab.engine.steps import held_back, split_done
from localfab.engine.text import StopMatcher, Utf8Stream
from localfab.engine.thought import ThoughtStep
from localfab.engine.toolcalls import ToolStep
from localfab.engine.types import (
    ContextFull,
    Done,
    FinishReason,
    GenerationOptions,
    SamplingParams,
    StopType,
    Timings,
    TokenEvent,
    TokenProbs,
)
from localfab.errors import ContextOverflow, UsageError

if TYPE_CHECKING:
    from localfab.engine.handle import Handle
    from localfab.engine.kvcache import KVCache
    from localfab.engine.prompt_cache import Restored

Logits = np.ndarray[Any, np.dtype[np.float32]]
Ranked = tuple[tuple[tuple[int, bytes, float], ...], float]


def check_request(engine: Handle, prompt: Sequence[int], opts: GenerationOptions) -> None:
    """UsageError / ContextOverflow for a request the engine cannot start."""
    if not prompt:
        raise UsageError("the prompt is empty")
    if prompt[-1] < 0:  # an image's id (`image_ids`): the reply follows text
        raise UsageError("a prompt cannot end with an image: text must follow it")
    if opts.max_tokens == 0 or opts.max_tokens < -1:
        raise UsageError(f"max_tokens must be positive or -1 for no limit, not {opts.max_tokens}")
    if len(prompt) >= engine.n_ctx:
        raise ContextOverflow(len(prompt), engine.n_ctx)
    engine.check_tokens(prompt)


def new_sampler(
    engine: Handle, p: SamplingParams, *, readable: bool = False
) -> GuardedSampler | None:
    """The samplers for one generation; None for plain greedy (see `is_fast_greedy`).

    `readable`: a chain whose output can be read after each token (post_sampling_probs), run
    on the sampler's own candidate array rather than in one native call.
    """
    if is_fast_greedy(p) and not readable:
        return None
    bias = dict(p.logit_bias)
    if p.ignore_eos:
        bias.update({t: float("-inf") for t in engine.eog_tokens()})
    if bias:
        engine.check_tokens(list(bias))
    ctx = None if readable else engine.ctx
    return GuardedSampler(engine.vocab, engine.n_vocab, engine.n_ctx, p, bias, ctx)


def post_sampling(opts: GenerationOptions) -> bool:
    """Whether each token reports the sampler chain's probabilities (post_sampling_probs)."""
    return opts.post_sampling_probs and opts.n_probs > 0


def rank(logits: Logits, n: int, token_bytes: Callable[[int], bytes]) -> Ranked:
    """The `n` most likely next tokens (token, piece, logprob) and the log partition sum."""
    peak = float(logits.max())
    log_z = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    n = min(n, len(logits))
    best = np.argpartition(logits, -n)[-n:]
    best = best[np.argsort(-logits[best], kind="stable")]
    top = tuple((int(t), token_bytes(int(t)), float(logits[t]) - log_z) for t in best)
    return top, log_z


def post_probs(
    sampler: GuardedSampler, n: int, tok: int, piece: bytes, token_bytes: Callable[[int], bytes]
) -> TokenProbs:
    """`tok`'s probability and the `n` likeliest tokens after the sampler chain."""
    ids, probs, p_tok = sampler.kept(n, tok)
    top = tuple(
        (int(t), token_bytes(int(t)), math.log(q) if q > 0 else -math.inf)
        for t, q in zip(ids, probs, strict=True)
    )
    return TokenProbs(piece, math.log(p_tok) if p_tok > 0 else -math.inf, top, post=True)


def argmax_without(logits: Logits, banned: np.ndarray[Any, np.dtype[Any]]) -> int:
    """The likeliest token that is not in `banned` (greedy with ignore_eos)."""
    masked = logits.copy()
    masked[banned] = -np.inf
    return int(masked.argmax())


def make_room(kv: KVCache, on_context_full: ContextFull | None, generated: list[int]) -> bool:
    """The window is full: shift the cache to what `on_context_full` asks; False to stop."""
    target = on_context_full(list(generated)) if on_context_full else None
    if target is None or len(target) >= kv.n_ctx:
        return False
    kv.rebase(target)
    return True


def new_thought(engine: Handle, opts: GenerationOptions) -> ThoughtStep | None:
    """The split (and budget) of a thinking model's reply; None without `opts.thinking`."""
    thinking = opts.thinking
    if thinking is None:
        return None
    forced: list[int] = []
    # A grammar decides the whole reply, its block included: no token is forced past it.
    if opts.reasoning_budget >= 0 and not opts.sampling.grammar:
        # As llama-server: the message's tokens, then the closing tag's (each tokenized alone).
        message = opts.reasoning_budget_message
        if message:
            forced = engine.tokenize(message, add_special=False, parse_special=True)
        forced += engine.tokenize(thinking.end, add_special=False, parse_special=True)
    tail = thinking.prompt_tail
    n_tail = len(engine.tokenize(tail, add_special=False, parse_special=True)) if tail else 0
    return ThoughtStep(thinking, opts.reasoning_budget, forced, n_tail=n_tail)


def cancelled_before_first(kv: KVCache, n_reused: int, t_start: float, n_prompt: int) -> Done:
    """The Done of a generation cancelled before its first token (while its prompt ran)."""
    timings = Timings(
        cache_n=n_reused,
        prompt_n=len(kv.cached) - n_reused,
        prompt_ms=(time.perf_counter() - t_start) * 1e3,
    )
    return Done("", "cancelled", "cancel", (), timings, n_prompt)


class ReplyState:
    """One reply from its first token to its Done (see the module's docstring).

    Made once the prompt is decided; `step(logits, row)` for each position the caller has
    logits for, `ended()` after each token it passes on, `finish()` for the closing events.
    The caller owns the sampler's life (`close`).
    """

    def __init__(
        self,
        engine: Handle,
        opts: GenerationOptions,
        sampler: GuardedSampler | None,
        *,
        n_prompt: int,
        n_reused: int = 0,
        t_start: float = 0.0,
    ) -> None:
        self.vocab = engine.vocab
        self.token_bytes = engine.token_bytes
        self.opts = opts
        self.sampler = sampler
        self.n_prompt = n_prompt
        self.n_reused = n_reused
        self.t_start = t_start or time.perf_counter()
        self.utf8 = Utf8Stream()
        if opts.carry:
            self.utf8.feed(opts.carry)
        self.stops = StopMatcher(opts.stop)
        self.generated: list[int] = []
        self.parts: list[str] = []
        self.finish_reason: FinishReason = "length"
        self.stop_type: StopType = "limit"
        self.t_first = 0.0
        self.draft_n = 0
        self.draft_n_accepted = 0
        self.draft_verifies = 0
        # What the prompt cache gave back before the prompt ran (`KVCache.swap_with_cache`).
        self.restored: Restored | None = None
        self.n_probs = opts.n_probs
        # Probabilities ranked from the raw logits before sampling (not the chain's output).
        self.raw_probs = opts.n_probs > 0 and not post_sampling(opts)
        self.eog: np.ndarray[Any, np.dtype[Any]] | None = None
        if sampler is None and opts.sampling.ignore_eos:
            self.eog = np.array(engine.eog_tokens())
        self.thought = new_thought(engine, opts)
        calling = opts.tools
        self.tools = None if calling is None else ToolStep(calling)
        # A lazy tool-call grammar does not see a reasoning block (a call there is a thought).
        self._blind_in_reasoning = (
            calling is not None
            and not calling.grammar_in_reasoning
            and bool(opts.sampling.grammar_triggers)
        )

    def pick(self, logits: Logits, row: int = -1) -> int:
        """The next token from `logits`, output `row` of the last batch (-1: the last)."""
        sampler = self.sampler
        if sampler is not None:
            return sampler.sample_at(logits, row)
        tok = int(logits.argmax())
        eog = self.eog
        if eog is not None and tok in eog:
            tok = argmax_without(logits, eog)
        return tok

    def step(self, logits: Logits, row: int = -1) -> TokenEvent | None:
        """Sample at one position and take the token; None when it ends the reply (eos)."""
        n_probs = self.n_probs
        ranked = rank(logits, n_probs, self.token_bytes) if self.raw_probs else None
        thought = self.thought
        forced = None if thought is None else thought.forced()
        tok = self.pick(logits, row) if forced is None else forced
        generated = self.generated
        if not generated:
            self.t_first = time.perf_counter()
        if lc.llama_vocab_is_eog(self.vocab, tok):
            self.finish_reason, self.stop_type = "stop", "eos"
            return None
        sampler = self.sampler
        if sampler is not None:
            if forced is not None:
                sampler.accept_forced(tok)
            elif self._blind_in_reasoning and thought and thought.split.state == "reasoning":
                sampler.accept(tok, grammar=False)
            else:
                sampler.accept(tok)
        generated.append(tok)
        piece = self.token_bytes(tok)
        text = self.stops.feed(self.utf8.feed(piece))
        if text:
            self.parts.append(text)
        probs = None
        if ranked is not None:
            top, log_z = ranked
            probs = TokenProbs(piece, float(logits[tok]) - log_z, top)
        elif n_probs > 0:
            assert sampler is not None  # post_sampling_probs: a readable one (see new_sampler)
            probs = post_probs(sampler, n_probs, tok, piece, self.token_bytes)
        tools = self.tools
        if thought is None and tools is None:
            return TokenEvent(tok, text, probs)
        parts: tuple[tuple[str, str], ...]
        if thought is not None:
            parts = thought.take(text, whole=not self.utf8.pending())
        else:
            parts = (("content", text),) if text else ()
        if tools is None:
            return TokenEvent(tok, text, probs, parts)
        parts, calls = tools.take(parts)
        return TokenEvent(tok, text, probs, parts, calls)

    def ended(self) -> bool:
        """After a token was passed on: whether a stop string, a cancel or max_tokens ends
        the reply (the reason is kept for `finish`)."""
        if self.stops.matched is not None:
            self.finish_reason, self.stop_type = "stop", "word"
            return True
        cancel = self.opts.cancel
        if cancel is not None and cancel.is_set():
            self.finish_reason, self.stop_type = "cancelled", "cancel"
            return True
        return len(self.generated) == self.opts.max_tokens

    def end(self, finish_reason: FinishReason, stop_type: StopType) -> None:
        """The reply ends for a reason found outside the step (a full window, a stop)."""
        self.finish_reason, self.stop_type = finish_reason, stop_type

    def finish(self) -> list[TokenEvent | Done]:
        """The held-back tail of the text (if any) and the Done that closes the stream."""
        events: list[TokenEvent | Done] = []
        generated, stops, utf8 = self.generated, self.stops, self.utf8
        finish, stop_type = self.finish_reason, self.stop_type
        pending = b""
        if finish == "length" and stop_type == "limit":
            pending = utf8.pending()  # a continuation may complete the character
        tail = ""
        if stops.matched is None:
            tail = stops.feed("" if pending else utf8.flush()) + stops.flush()
            if tail:
                self.parts.append(tail)
        last = self._last_event(tail)
        if last is not None:
            events.append(last)
        t_end = time.perf_counter()
        t_first = self.t_first or t_end
        timings = Timings(
            cache_n=self.n_reused,
            prompt_n=self.n_prompt - self.n_reused,
            prompt_ms=(t_first - self.t_start) * 1e3,
            predicted_n=len(generated) + (1 if stop_type == "eos" else 0),
            predicted_ms=(t_end - t_first) * 1e3,
            ttft_ms=(t_first - self.t_start) * 1e3,
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
            draft_verifies=self.draft_verifies,
        )
        if self.restored is not None:
            r = self.restored
            timings = replace(
                timings, restored_n=r.n_tokens, restore_ms=r.seconds * 1e3, restored_from=r.tier
            )
        done = Done(
            text="".join(self.parts),
            finish_reason=finish,
            stop_type=stop_type,
            tokens=tuple(generated),
            timings=timings,
            prompt_tokens=self.n_prompt,
            stopping_word=stops.matched or "",
            pending=pending,
        )
        events.append(self._split_done(done))
        return events

    def _last_event(self, tail: str) -> TokenEvent | None:
        """The event of the text held back to the end, and of what the reasoning split and the
        tool-call parser held back (None: nothing was)."""
        parts, calls = held_back(self.thought, self.tools, tail)
        if not (tail or parts or calls):
            return None
        return TokenEvent(self.generated[-1] if self.generated else -1, tail, None, parts, calls)

    def _split_done(self, done: Done) -> Done:
        """`done` with the reply's reasoning and answer apart, and its tool calls."""
        return split_done(done, self.thought, self.tools)
