"""The generation stream behind `Engine.stream`: prefill, the token loop, finish.

The token loop is the hot path: per token it reads the logits, picks a token, detokenizes it,
yields it and decodes it, with everything it calls held in locals. Whatever happens once per
reply (checks, sampler set-up, prefill, a full window, the final Done) lives in the helpers
around it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp as lc
import numpy as np

from localfab.engine.kvcache import KVCache
from localfab.engine.sampling import GuardedSampler, is_fast_greedy
from localfab.engine.text import StopMatcher, Utf8Stream
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
from localfab.errors import ContextOverflow, LocalfabError, UsageError

if TYPE_CHECKING:
    from localfab.engine.llama import Engine
    from localfab.engine.spec import Speculator

Logits = np.ndarray[Any, np.dtype[np.float32]]
Ranked = tuple[tuple[tuple[int, bytes, float], ...], float]


def check_request(engine: Engine, prompt: Sequence[int], opts: GenerationOptions) -> None:
    """UsageError / ContextOverflow for a request the engine cannot start."""
    if not prompt:
        raise UsageError("the prompt is empty")
    if opts.max_tokens == 0 or opts.max_tokens < -1:
        raise UsageError(f"max_tokens must be positive or -1 for no limit, not {opts.max_tokens}")
    if len(prompt) >= engine.n_ctx:
        raise ContextOverflow(len(prompt), engine.n_ctx)
    engine.check_tokens(prompt)


def new_sampler(
    engine: Engine, p: SamplingParams, *, readable: bool = False
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
    ctx = None if readable else engine._ctx
    return GuardedSampler(engine._vocab, engine.n_vocab, engine.n_ctx, p, bias, ctx)


def _start(engine: Engine, prompt: Sequence[int], opts: GenerationOptions) -> GuardedSampler | None:
    """Check the request and take the engine's lock; the caller must `_end` it."""
    check_request(engine, prompt, opts)
    if not engine._lock.acquire(blocking=False):
        raise LocalfabError("the engine is busy with another generation")
    engine._owner = threading.get_ident()
    try:
        return new_sampler(engine, opts.sampling, readable=post_sampling(opts))
    except BaseException:
        engine._lock.release()
        raise


def _end(engine: Engine, sampler: GuardedSampler | None) -> None:
    if sampler is not None:
        sampler.close()
    engine._lock.release()


def prefill(kv: KVCache, prompt: Sequence[int], cancel: threading.Event | None) -> int:
    """Evaluate what the cache lacks of `prompt` (a cancel stops between micro-batches).

    Fed one micro-batch at a time, as llama.cpp computes it anyway: a client that hangs up
    during a long prompt frees the engine within one micro-batch, not after the whole batch.
    Returns how many prompt tokens were reused from the cache.
    """
    n_reused = kv.reuse_prefix(prompt)
    new = list(prompt[n_reused:])
    step = kv.n_ubatch
    for off in range(0, len(new), step):
        if cancel is not None and cancel.is_set():
            break
        chunk = new[off : off + step]
        kv.decode(chunk, n_reused + off, logits_last=off + len(chunk) >= len(new))
    return n_reused


def _cancelled(kv: KVCache, n_reused: int, t_start: float, n_prompt: int) -> Done:
    """The Done of a generation cancelled before its first token."""
    timings = Timings(
        cache_n=n_reused,
        prompt_n=len(kv.cached) - n_reused,
        prompt_ms=(time.perf_counter() - t_start) * 1e3,
    )
    return Done("", "cancelled", "cancel", (), timings, n_prompt)


def rank(logits: Logits, n: int, token_bytes: Callable[[int], bytes]) -> Ranked:
    """The `n` most likely next tokens (token, piece, logprob) and the log partition sum."""
    peak = float(logits.max())
    log_z = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    n = min(n, len(logits))
    best = np.argpartition(logits, -n)[-n:]
    best = best[np.argsort(-logits[best], kind="stable")]
    top = tuple((int(t), token_bytes(int(t)), float(logits[t]) - log_z) for t in best)
    return top, log_z


def _probs(ranked: Ranked, piece: bytes, logits: Logits, tok: int) -> TokenProbs:
    top, log_z = ranked
    return TokenProbs(piece, float(logits[tok]) - log_z, top)


def _token_probs(
    sampler: GuardedSampler | None,
    ranked: Ranked | None,
    piece: bytes,
    logits: Logits,
    tok: int,
    n: int,
    token_bytes: Callable[[int], bytes],
) -> TokenProbs:
    """A token's probabilities: from the raw logits (`ranked`), or after the sampler chain."""
    if ranked is not None:
        return _probs(ranked, piece, logits, tok)
    assert sampler is not None  # post_sampling_probs: a readable one (see new_sampler)
    return _post_probs(sampler, n, tok, piece, token_bytes)


def post_sampling(opts: GenerationOptions) -> bool:
    """Whether each token reports the sampler chain's probabilities (post_sampling_probs)."""
    return opts.post_sampling_probs and opts.n_probs > 0


def _raw_probs(opts: GenerationOptions) -> int:
    """How many likeliest tokens to rank from the raw logits, before sampling (0: none)."""
    return 0 if post_sampling(opts) else opts.n_probs


def _speculator(engine: Engine, opts: GenerationOptions) -> Speculator | None:
    """The engine's speculator for this reply, if it speculates. Not with post-sampling
    probabilities: drafted tokens have no sampler output of their own to report."""
    return None if post_sampling(opts) else engine._speculator


def _post_probs(
    sampler: GuardedSampler, n: int, tok: int, piece: bytes, token_bytes: Callable[[int], bytes]
) -> TokenProbs:
    """`tok`'s probability and the `n` likeliest tokens after the sampler chain."""
    ids, probs, p_tok = sampler.kept(n, tok)
    top = tuple(
        (int(t), token_bytes(int(t)), math.log(q) if q > 0 else -math.inf)
        for t, q in zip(ids, probs, strict=True)
    )
    return TokenProbs(piece, math.log(p_tok) if p_tok > 0 else -math.inf, top, post=True)


def _argmax_without(logits: Logits, banned: np.ndarray[Any, np.dtype[Any]]) -> int:
    """The likeliest token that is not in `banned` (greedy with ignore_eos)."""
    masked = logits.copy()
    masked[banned] = -np.inf
    return int(masked.argmax())


def _make_room(kv: KVCache, on_context_full: ContextFull | None, generated: list[int]) -> bool:
    """The window is full: shift the cache to what `on_context_full` asks; False to stop."""
    target = on_context_full(list(generated)) if on_context_full else None
    if target is None or len(target) >= kv.n_ctx:
        return False
    kv.rebase(target)
    return True


def _finish(
    *,
    n_prompt: int,
    n_reused: int,
    generated: list[int],
    parts: list[str],
    finish: FinishReason,
    stop_type: StopType,
    utf8: Utf8Stream,
    stops: StopMatcher,
    t_start: float,
    t_first: float,
    drafted: tuple[int, int, int] = (0, 0, 0),
) -> list[TokenEvent | Done]:
    """The held-back tail of the text (if any) and the Done that closes the stream."""
    events: list[TokenEvent | Done] = []
    pending = b""
    if finish == "length" and stop_type == "limit":
        pending = utf8.pending()  # a continuation may complete the character
    if stops.matched is None:
        tail = stops.feed("" if pending else utf8.flush()) + stops.flush()
        if tail:
            parts.append(tail)
            events.append(TokenEvent(generated[-1] if generated else -1, tail))
    t_end = time.perf_counter()
    t_first = t_first or t_end
    timings = Timings(
        cache_n=n_reused,
        prompt_n=n_prompt - n_reused,
        prompt_ms=(t_first - t_start) * 1e3,
        predicted_n=len(generated) + (1 if stop_type == "eos" else 0),
        predicted_ms=(t_end - t_first) * 1e3,
        ttft_ms=(t_first - t_start) * 1e3,
        draft_n=drafted[0],
        draft_n_accepted=drafted[1],
        draft_verifies=drafted[2],
    )
    done = Done(
        text="".join(parts),
        finish_reason=finish,
        stop_type=stop_type,
        tokens=tuple(generated),
        timings=timings,
        prompt_tokens=n_prompt,
        stopping_word=stops.matched or "",
        pending=pending,
    )
    events.append(done)
    return events


def stream(
    engine: Engine, prompt: Sequence[int], opts: GenerationOptions
) -> Iterator[TokenEvent | Done]:
    """Generate after `prompt`: TokenEvents, then one Done (see `Engine.stream`)."""
    t_start = time.perf_counter()
    sampler = _start(engine, prompt, opts)
    try:
        kv = engine._kv
        cancel = opts.cancel
        n_reused = prefill(kv, prompt, cancel)
        if cancel is not None and cancel.is_set():
            yield _cancelled(kv, n_reused, t_start, len(prompt))
            return
        utf8 = Utf8Stream()
        if opts.carry:
            utf8.feed(opts.carry)
        stops = StopMatcher(opts.stop)
        speculator = _speculator(engine, opts)  # chosen once per reply, never inside the loop
        if speculator is not None:
            reply = yield from speculator.stream(engine, sampler, prompt, opts, utf8, stops)
            yield from _finish(
                n_prompt=len(prompt),
                n_reused=n_reused,
                generated=reply.generated,
                parts=reply.parts,
                finish=reply.finish,
                stop_type=reply.stop_type,
                utf8=utf8,
                stops=stops,
                t_start=t_start,
                t_first=reply.t_first,
                drafted=(reply.draft_n, reply.draft_n_accepted, reply.draft_verifies),
            )
            return
        generated: list[int] = []
        parts: list[str] = []
        finish: FinishReason = "length"
        stop_type: StopType = "limit"
        t_first = 0.0
        # The loop's collaborators, held in locals: one lookup per reply, not per token.
        vocab = engine._vocab
        is_eog = lc.llama_vocab_is_eog
        logits_of = kv.logits
        decode_one = kv.decode_one
        token_bytes = engine.token_bytes
        cached = kv.cached
        n_ctx = kv.n_ctx
        max_tokens = opts.max_tokens
        n_probs = opts.n_probs
        raw_probs = _raw_probs(opts)
        ignore_eos = sampler is None and opts.sampling.ignore_eos
        eog = np.array(engine.eog_tokens()) if ignore_eos else None
        while True:
            ranked = rank(logits_of(), n_probs, token_bytes) if raw_probs else None
            if sampler is None:
                logits = logits_of()
                tok = int(logits.argmax())
                if eog is not None and tok in eog:
                    tok = _argmax_without(logits, eog)
            else:
                tok = sampler.sample(logits_of())
            if not generated:
                t_first = time.perf_counter()
            if is_eog(vocab, tok):
                finish, stop_type = "stop", "eos"
                break
            if sampler is not None:
                sampler.accept(tok)
            generated.append(tok)
            piece = token_bytes(tok)
            text = stops.feed(utf8.feed(piece))
            if text:
                parts.append(text)
            probs = (
                _token_probs(sampler, ranked, piece, logits_of(), tok, n_probs, token_bytes)
                if n_probs > 0
                else None
            )
            yield TokenEvent(tok, text, probs)
            if stops.matched is not None:
                finish, stop_type = "stop", "word"
                break
            if cancel is not None and cancel.is_set():
                finish, stop_type = "cancelled", "cancel"
                break
            if len(generated) == max_tokens:
                break
            if len(cached) >= n_ctx and not _make_room(kv, opts.on_context_full, generated):
                stop_type = "context"
                break
            decode_one(tok)
        yield from _finish(
            n_prompt=len(prompt),
            n_reused=n_reused,
            generated=generated,
            parts=parts,
            finish=finish,
            stop_type=stop_type,
            utf8=utf8,
            stops=stops,
            t_start=t_start,
            t_first=t_first,
        )
    finally:
        _end(engine, sampler)
