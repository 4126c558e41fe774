"""The speculative loop of `Engine.stream`: draft, verify in one decode, keep while it matches.

Every position's token goes through the reply's `ReplyState.step`, the token step of every
decoding path; this loop only decides what to decode.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING

from localfab.engine.kvcache import KVCache
from localfab.engine.reply import ReplyState, make_room
from localfab.engine.spec.drafters import Drafter, ModelDraft, NgramDraft
from localfab.engine.spec.exactness import PROBE_MAX
from localfab.engine.spec.tuner import SpecCosts, Tuner, propose
from localfab.engine.types import ONE_THREAD_CELLS, SpecSettings, TokenEvent

if TYPE_CHECKING:
    from localfab.engine.handle import Handle


class Speculator:
    """The speculative token loop of an engine (one per engine; see `Engine.set_speculation`).

    `max_batch` caps a verify (the pending token and the draft) at the size `exact_batch`
    found to give the logits of plain decoding, `max_batch_past` one that goes past
    `ONE_THREAD_CELLS` of cache (`limit`).
    """

    def __init__(
        self,
        settings: SpecSettings,
        draft: Handle | None = None,
        max_batch: int = PROBE_MAX,
        max_batch_past: int | None = None,
    ) -> None:
        self.settings = settings
        self.draft_engine = draft
        self.max_batch = max_batch
        self.max_batch_past = max_batch if max_batch_past is None else max_batch_past
        self.costs = SpecCosts()
        self.drafter: Drafter = (
            ModelDraft(draft, settings.draft_p_min) if draft is not None else NgramDraft()
        )

    def limit(self, n_cached: int) -> int:
        """The most tokens a verify after `n_cached` cells may hold."""
        within = min(self.max_batch, ONE_THREAD_CELLS - n_cached)
        return max(self.max_batch_past, within)

    def close(self) -> None:
        if self.draft_engine is not None:
            self.draft_engine.close()
            self.draft_engine = None

    def run(self, kv: KVCache, reply: ReplyState, prompt: Sequence[int]) -> Iterator[TokenEvent]:
        """Generate after `prompt` (already in `kv`) until the reply ends; how it ended is kept
        in `reply`."""
        s = self.settings
        drafter = self.drafter
        drafter.reset(prompt)
        tuner = Tuner(self.costs, adaptive=s.adaptive, k_max=s.max_draft, cheap=drafter.cheap)
        event = reply.step(kv.logits(), -1)
        stop = event is None
        if event is not None:
            yield event
            stop = reply.ended()
        generated = reply.generated
        cached = kv.cached
        n_ctx = kv.n_ctx
        opts = reply.opts
        max_tokens = opts.max_tokens
        n_pushed = 0
        while not stop:
            for tok in generated[n_pushed:]:
                drafter.push(tok)
            n_pushed = len(generated)
            pending = generated[-1]
            if len(cached) >= n_ctx:
                if not make_room(kv, opts.on_context_full, generated):
                    reply.end("length", "context")
                    return
                drafter.rebase([*cached, pending])
            room = min(n_ctx - len(cached), self.limit(len(cached))) - 1
            if max_tokens > 0:
                room = min(room, max_tokens - len(generated) - 1)
            t0 = time.perf_counter()
            drafts = propose(tuner, drafter, min(room, s.max_draft))
            if drafts and len(drafts) >= s.draft_min:
                stop = yield from self._verify(kv, reply, tuner, pending, drafts, t0)
                continue
            guess = drafter.draft(1) if drafter.cheap and s.adaptive else []
            t0 = time.perf_counter()
            kv.decode_one(pending)
            tuner.plain(time.perf_counter() - t0)
            event = reply.step(kv.logits(), -1)
            if event is None:
                return
            if guess:
                tuner.guess(guess[0] == event.token)
            yield event
            stop = reply.ended()

    def _verify(
        self,
        kv: KVCache,
        reply: ReplyState,
        tuner: Tuner,
        pending: int,
        drafts: list[int],
        t_draft: float,
    ) -> Generator[TokenEvent, None, bool]:
        """One decode of the pending token and the draft; take tokens while they match."""
        n0 = len(kv.cached)
        rows = kv.decode_rows([pending, *drafts], n0)
        seconds = time.perf_counter() - t_draft
        n_draft = len(drafts)
        reply.draft_n += n_draft
        reply.draft_verifies += 1
        i = 0
        kept = 0
        stop = False
        try:
            while True:
                event = reply.step(rows[i], i)
                if event is None:
                    stop = True
                    break
                right = i < n_draft and event.token == drafts[i]
                kept += right
                yield event
                stop = reply.ended()
                if stop or not right:
                    break
                i += 1
        finally:
            # Keep the pending token and the drafted tokens taken before the last position;
            # the token sampled at position i is evaluated by the next step, as in the plain
            # loop. Runs when the consumer closes the stream too.
            kv.truncate(n0 + 1 + i)
        reply.draft_n_accepted += kept
        tuner.verify(n_draft, kept, seconds)
        return stop
