"""The single-sequence loop behind `Engine.stream`: prefill, then one token at a time.

Per token the loop reads the logits, lets the reply's `ReplyState` take a token (the token step
every path shares), yields it and decodes it. Speculative decoding, when the engine has it on,
runs its own loop over the same step (`spec.loop`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from localfab.engine.kvcache import KVCache
from localfab.engine.reply import (
    ReplyState,
    cancelled_before_first,
    check_request,
    make_room,
    new_sampler,
    post_sampling,
)
from localfab.engine.types import Done, GenerationOptions, TokenEvent

if TYPE_CHECKING:
    from localfab.engine.spec import Speculating


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


def stream(
    engine: Speculating, prompt: Sequence[int], opts: GenerationOptions
) -> Iterator[TokenEvent | Done]:
    """Generate after `prompt`: TokenEvents, then one Done (see `Engine.stream`)."""
    t_start = time.perf_counter()
    check_request(engine, prompt, opts)
    engine.claim()
    sampler = None
    try:
        sampler = new_sampler(engine, opts.sampling, readable=post_sampling(opts))
        kv = engine.kv
        cancel = opts.cancel
        # Another conversation's turn: see `Engine.use_prompt_cache`.
        restored = kv.swap_with_cache(prompt)
        n_reused = prefill(kv, prompt, cancel)
        if cancel is not None and cancel.is_set():
            yield cancelled_before_first(kv, n_reused, t_start, len(prompt))
            return
        reply = ReplyState(
            engine, opts, sampler, n_prompt=len(prompt), n_reused=n_reused, t_start=t_start
        )
        reply.restored = restored
        # Not with post-sampling probabilities: drafted tokens have no sampler output of their
        # own to report. Chosen once per reply, never inside the loop.
        speculator = None if post_sampling(opts) else engine.speculator
        if speculator is not None:
            yield from speculator.run(kv, reply, prompt)
        else:
            yield from _loop(kv, reply)
        yield from reply.finish()
    finally:
        if sampler is not None:
            sampler.close()
        engine.release()


def _loop(kv: KVCache, reply: ReplyState) -> Iterator[TokenEvent]:
    """Decode one token at a time until the reply ends (its reason is kept in `reply`)."""
    # The loop's collaborators, held in locals: one lookup per reply, not per token.
    step = reply.step
    ended = reply.ended
    logits_of = kv.logits
    decode_one = kv.decode_one
    cached = kv.cached
    n_ctx = kv.n_ctx
    on_context_full = reply.opts.on_context_full
    generated = reply.generated
    while True:
        event = step(logits_of())
        if event is None:
            return
        yield event
        if ended():
            return
        if len(cached) >= n_ctx and not make_room(kv, on_context_full, generated):
            reply.end("length", "context")
            return
        decode_one(event.token)
