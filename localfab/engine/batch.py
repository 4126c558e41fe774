"""Continuous batching: several replies decoded together, one `llama_decode` per step.

Each slot is a KV sequence of the engine's context (see `EngineSettings.n_seq_max`) with its own
reply: sampler chain, seed, stop strings, grammar, cancellation, prefix reuse and context shift.
One `step()` builds a single batch holding the next token of every slot that is generating, then
adds one micro-batch (`n_ubatch`) of the prompts still being processed, so a long prompt that
arrives holds up the streams already running for one micro-batch at a time, never for the whole
prompt (chunked prefill), and a cancelled prompt stops within one. After the decode, every slot
that has logits takes its next token through its `ReplyState`, the token step of every path.

Slot 0 is the engine's own sequence (`Engine.stream` uses it too, when no batch runs). A reply
that asks for copies (`BatchDecoder.follow`) has its prompt evaluated once: when the leader's
prompt is done its cells are copied to the followers, which sample from the same logits.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp as lc
import numpy as np

from localfab.engine.image_ids import image_end
from localfab.engine.kvcache import KVCache
from localfab.engine.reply import (
    ReplyState,
    cancelled_before_first,
    check_request,
    make_room,
    new_sampler,
    post_sampling,
)
from localfab.engine.slots import Slot, SlotEvents, SlotReply, choose_slot
from localfab.engine.spec.slots import SlotSpec, SlotSpeculation
from localfab.engine.types import (
    Done,
    FinishReason,
    GenerationOptions,
    StopType,
    TokenEvent,
)
from localfab.errors import ContextOverflow, LocalfabError

if TYPE_CHECKING:
    from localfab.engine.spec import Speculating

__all__ = ["BatchDecoder", "Slot", "SlotEvents"]  # the slot types are `slots`'s


class BatchDecoder:
    """Replies on the engine's sequences, decoded together. Not thread-safe: one thread steps."""

    def __init__(self, engine: Speculating, n_slots: int | None = None) -> None:
        """Slots on the engine's first `n_slots` sequences (default: all of them)."""
        self.engine = engine
        n = engine.n_seq_max if n_slots is None else min(max(n_slots, 1), engine.n_seq_max)
        shared = engine.n_seq_max > 1
        self.slots = [Slot(0, engine.kv)] + [
            Slot(
                i,
                KVCache(
                    engine.ctx, engine.n_ctx, engine.n_batch, engine.n_vocab, seq=i, shared=shared
                ),
            )
            for i in range(1, n)
        ]
        for slot in self.slots[1:]:
            slot.kv.clear()  # cells an earlier decoder left in these sequences: not mirrored
            slot.kv.images = engine.kv.images  # a vision model's projector, for every slot
        self.n_batch = engine.n_batch
        # Prompt tokens one step takes while other replies are generating: one micro-batch, so
        # their next tokens wait for one micro-batch of prompt, not for the whole prompt.
        self.n_ubatch = min(int(lc.llama_n_ubatch(engine.ctx)), self.n_batch)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._draft_s = 0.0  # seconds spent drafting for the step being built
        self._no_drafts = False  # the next step drafts nothing (a shared pool had no room)
        self.n_decode = 0  # llama_decode calls made
        self.n_busy = 0  # busy slots summed over those calls
        # Speculative decoding per slot, when the engine has it on: each reply drafts from its
        # own history (or in its own sequence of the draft model) and verifies in the step.
        sp = engine.speculator
        self.spec = SlotSpeculation(sp, n) if sp is not None else None

    def close(self) -> None:
        """Free the batch and every slot's buffers but slot 0's (the engine's own)."""
        for slot in self.slots:
            if slot.reply is not None and slot.reply.state.sampler is not None:
                slot.reply.state.sampler.close()
            slot.reply = None
        for slot in self.slots[1:]:
            slot.kv.free()
        if self.spec is not None:
            self.spec.close()
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None

    # --- slots -------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return any(s.reply is not None for s in self.slots)

    def idle(self) -> list[Slot]:
        return [s for s in self.slots if s.reply is None]

    def pick(self, prompt: Sequence[int]) -> Slot | None:
        """The idle slot for `prompt`; None when all are busy (see `slots.choose_slot`)."""
        return choose_slot(self.idle(), prompt)

    @staticmethod
    def touch(slot: Slot) -> None:
        """The slot was used now (for the least-recently-used choice)."""
        slot.last_used = time.perf_counter()

    def start(self, slot: Slot, prompt: Sequence[int], opts: GenerationOptions) -> None:
        """Begin a reply on an idle slot; UsageError/ContextOverflow for one it cannot run."""
        if slot.reply is not None:
            raise LocalfabError(f"slot {slot.id} is busy")
        engine = self.engine
        check_request(engine, prompt, opts)
        sampler = new_sampler(engine, opts.sampling, readable=post_sampling(opts))
        prompt = list(prompt)
        n_reused = slot.kv.reuse_prefix(prompt)
        state = ReplyState(engine, opts, sampler, n_prompt=len(prompt), n_reused=n_reused)
        reply = SlotReply(prompt, prompt[n_reused:], state)
        reply.spec = self._new_spec(slot, opts, prompt)
        slot.reply = reply
        slot.last_used = state.t_start

    def _new_spec(self, slot: Slot, opts: GenerationOptions, prompt: list[int]) -> SlotSpec | None:
        """The reply's speculation: none when the engine has it off or for a reply that
        reports post-sampling probabilities (as `Engine.stream`)."""
        if self.spec is None or post_sampling(opts):
            return None
        return self.spec.new(slot.id, prompt)

    def follow(self, slot: Slot, leader: Slot, opts: GenerationOptions) -> None:
        """Begin a reply on `slot` with `leader`'s prompt, evaluated once: the leader's cells
        are copied here when its prompt is done (call right after `start` on the leader)."""
        assert leader.reply is not None
        self.start(slot, leader.reply.prompt, opts)
        assert slot.reply is not None
        slot.reply.leader = leader
        slot.reply.todo = []

    # --- the step ----------------------------------------------------------------------------

    def step(self) -> list[SlotEvents]:
        """One decode for every busy slot; what each slot got. Slots whose reply ended are idle
        afterwards (their Done, or their error, is among the events)."""
        out: list[SlotEvents] = []
        rows, chunks = self._fill(out)
        if self._batch.n_tokens:
            self._decode(rows, chunks, out)
        return out

    def _fill(self, out: list[SlotEvents]) -> tuple[list[tuple[Slot, int]], list[tuple[Slot, int]]]:
        """Put every busy slot's next tokens in the batch. Returns (slot, batch row) for each
        slot whose logits this step computes, and (slot, prompt tokens taken) for each slot
        whose prompt it feeds. Replies that end before decoding land in `out`."""
        rows: list[tuple[Slot, int]] = []
        chunks: list[tuple[Slot, int]] = []
        n = 0
        for slot in self.slots:
            r = slot.reply
            if r is not None and r.pending >= 0 and self._room_for(slot, r, out):
                rows.append((slot, n))  # the pending token's row: its logits are sampled
                n = self._fill_generating(slot, r, n)
        # Prompts get one micro-batch per step (chunked prefill): beside running replies, whose
        # next tokens wait for one micro-batch of prompt, not the whole prompt; and alone, so a
        # cancel (a client that hung up) stops a long prompt within one micro-batch. llama.cpp
        # computes a larger batch one micro-batch at a time anyway.
        limit = min(self.n_ubatch + n, self.n_batch)
        for slot in self.slots:
            r = slot.reply
            if r is None or r.pending >= 0 or r.leader is not None:
                continue
            cancel = r.state.opts.cancel
            if cancel is not None and cancel.is_set():
                out.append(SlotEvents(slot, tuple(self._cancelled(slot))))
            elif r.todo and r.todo[0] < 0 and not self._image(slot, r, out):
                continue
            elif limit > n:
                taken, last = self._fill_prompt(slot, r, n, limit - n)
                n += taken
                chunks.append((slot, taken))
                if last:
                    rows.append((slot, n - 1))
        self._batch.n_tokens = n
        return rows, chunks

    def _room_for(self, slot: Slot, r: SlotReply, out: list[SlotEvents]) -> bool:
        """Whether a generating slot has a cell for its next token, after a context shift
        when its window is full; a reply that cannot go on ends (into `out`)."""
        kv = slot.kv
        if len(kv.cached) < kv.n_ctx:
            return True
        try:
            shifted = make_room(kv, r.state.opts.on_context_full, r.state.generated)
        except LocalfabError as exc:  # the shift failed: this reply ends, not the others
            self._release(slot)
            kv.sync_after_failure()
            out.append(SlotEvents(slot, error=exc))
            return False
        if not shifted:
            out.append(SlotEvents(slot, tuple(self._end(slot, "length", "context"))))
            return False
        if r.spec is not None:
            r.spec.drafter.rebase([*kv.cached, r.pending])
        return True

    def _fill_generating(self, slot: Slot, r: SlotReply, n: int) -> int:
        """Put a generating slot's pending token (and its draft) in the batch at row `n`;
        returns the next free row."""
        batch, kv = self._batch, slot.kv
        pos = len(kv.cached)
        self._put(batch, n, r.pending, pos, slot.id, True)
        n += 1
        if r.spec is not None:
            # Drafted tokens follow the pending one, each with its logits (the verify); room
            # is kept for one token of every other slot.
            t0 = time.perf_counter()
            room = 0 if self._no_drafts else self.n_batch - n - len(self.slots)
            assert self.spec is not None
            state = r.state
            drafts = self.spec.draft(r.spec, state.generated, kv, room, state.opts.max_tokens)
            self._draft_s += time.perf_counter() - t0
            for j, tok in enumerate(drafts):
                self._put(batch, n + j, tok, pos + 1 + j, slot.id, True)
            n += len(drafts)
        return n

    def _image(self, slot: Slot, r: SlotReply, out: list[SlotEvents]) -> bool:
        """An image at the head of a slot's prompt: encoded and decoded now, in a batch of its
        own (`engine.vision`); False when that failed (the reply ends with the error)."""
        n = image_end(r.todo, 1)
        try:
            slot.kv.decode(r.todo[:n], len(slot.kv.cached), logits_last=False)
        except LocalfabError as exc:
            self._release(slot)
            out.append(SlotEvents(slot, error=exc))
            return False
        del r.todo[:n]
        return True

    def _fill_prompt(self, slot: Slot, r: SlotReply, n: int, room: int) -> tuple[int, bool]:
        """Put up to `room` of a slot's prompt in the batch at row `n`: how many tokens, and
        whether they end the prompt (its last one then has logits). Text only: an image
        stops the chunk (the next step evaluates it, `_image`)."""
        chunk = r.todo[:room]
        if min(chunk, default=0) < 0:
            chunk = list(itertools.takewhile(lambda t: t >= 0, chunk))
        start = len(slot.kv.cached)
        last = len(chunk) == len(r.todo)
        for i, tok in enumerate(chunk):
            self._put(self._batch, n + i, tok, start + i, slot.id, last and i == len(chunk) - 1)
        return len(chunk), last

    @staticmethod
    def _put(batch: Any, i: int, tok: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    def _decode(
        self, rows: list[tuple[Slot, int]], chunks: list[tuple[Slot, int]], out: list[SlotEvents]
    ) -> None:
        batch = self._batch
        n_tokens = batch.n_tokens
        busy = [s for s in self.slots if s.reply is not None]
        before = {s.id: len(s.kv.cached) for s in busy}
        t0 = time.perf_counter()
        rc = lc.llama_decode(self.engine.ctx, batch)
        seconds = time.perf_counter() - t0 + self._draft_s
        self._draft_s = 0.0
        self.n_decode += 1
        self.n_busy += len(busy)
        if rc != 0:
            self._failed(rc, busy, before, out)
            return
        self._no_drafts = False
        if self.spec is not None and not chunks:
            # What a step costs, for the tuners: with no prompt in it, the generating slots'
            # tokens and whatever they drafted.
            n_draft = sum(len(s.reply.spec.drafts) for s, _ in rows if s.reply and s.reply.spec)
            self.spec.took(seconds, n_draft)
        # The cache mirrors: what each slot's sequence gained in this batch.
        seq_id, token = batch.seq_id, batch.token
        slots = self.slots
        for i in range(n_tokens):
            slots[seq_id[i][0]].kv.cached.append(token[i])
        for slot, taken in chunks:
            assert slot.reply is not None
            del slot.reply.todo[:taken]
        for slot, row in rows:
            logits = self._row(row)
            followers = self._followers(slot)  # before sampling: the leader may end at once
            for follower in followers:
                follower.kv.copy_from(slot.kv)
            r = slot.reply
            if r is not None and r.spec is not None:
                out.append(self._verify(slot, r, r.spec, row, before[slot.id]))
            else:
                out.append(self._sample_or_fail(slot, logits, row))
            for follower in followers:
                out.append(self._sample_or_fail(follower, logits, row))

    def _sample_or_fail(
        self, slot: Slot, logits: np.ndarray[Any, np.dtype[np.float32]], row: int
    ) -> SlotEvents:
        """The slot's next token; a reply whose sampler fails (a grammar at a dead end) ends
        with its error, and only that reply."""
        try:
            return SlotEvents(slot, tuple(self._sample(slot, logits, row)))
        except LocalfabError as exc:
            if slot.reply is not None:
                self._release(slot)
            return SlotEvents(slot, error=exc)

    def _verify(self, slot: Slot, r: SlotReply, sp: SlotSpec, row: int, n0: int) -> SlotEvents:
        """Sample at the pending token's row and at each drafted token's while the draft holds
        (as `Speculator._verify`); the cells of the drafted tokens not kept leave the cache.
        Without a draft this is the plain sample, and a free guess is scored."""
        drafts, sp.drafts = sp.drafts, []
        state = r.state
        state.draft_n += len(drafts)
        state.draft_verifies += bool(drafts)
        events: list[TokenEvent | Done] = []
        i = 0
        kept = 0
        try:
            while True:
                events += self._sample(slot, self._row(row + i), row + i)
                if slot.reply is None:  # ended: eos, a stop string, cancel or max_tokens
                    break
                tok = state.generated[-1]
                if not drafts and sp.guess >= 0:
                    sp.tuner.guess(sp.guess == tok)
                if i >= len(drafts) or tok != drafts[i]:
                    break
                kept += 1
                state.draft_n_accepted += 1
                i += 1
        except LocalfabError as exc:  # a grammar at a dead end: this reply ends, not the others
            if slot.reply is not None:
                self._release(slot)
            return SlotEvents(slot, error=exc)
        finally:
            # The pending token and the drafted tokens taken before the last position stay;
            # the token sampled last is decoded by the next step, as in the plain loop.
            if drafts:
                slot.kv.truncate(n0 + 1 + i)
        if drafts:
            sp.tuner.accepted(len(drafts), kept)
        else:
            sp.tuner.idle()
        return SlotEvents(slot, tuple(events))

    def _followers(self, leader: Slot) -> list[Slot]:
        """The slots waiting for `leader`'s prompt, now theirs as well."""
        found = []
        for slot in self.slots:
            r = slot.reply
            if r is not None and r.leader is leader:
                r.leader = None
                r.state.n_reused = len(r.prompt)  # evaluated once, by the leader
                found.append(slot)
        return found

    def _row(self, row: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        ptr = lc.llama_get_logits_ith(self.engine.ctx, row)
        if not ptr:
            raise LocalfabError(f"llama.cpp computed no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(self.engine.n_vocab,))

    def _failed(
        self, rc: int, busy: list[Slot], before: dict[int, int], out: list[SlotEvents]
    ) -> None:
        """A decode that failed: every slot's cache goes back to what it held before the step.

        No KV room left (a shared pool, --kv-unified): a step that held drafted tokens is tried
        again without them; else idle slots' cached prompts are dropped and the next step tries
        again; when none is left to drop, the prompts being processed
        end with an error, else the youngest reply ends where it is (a "context" stop, its text
        kept). Any other failure ends every reply in the batch with an error.
        """
        for slot in busy:
            slot.kv.sync_after_failure()
            slot.kv.truncate(before[slot.id])
        drafted = any(s.reply is not None and s.reply.spec and s.reply.spec.drafts for s in busy)
        for slot in busy:
            if slot.reply is not None and slot.reply.spec is not None:
                slot.reply.spec.drafts = []
        if rc == 1 and drafted:
            self._no_drafts = True  # drafts took the room: try the step again without them
            return
        if rc == 1:
            idle = [s for s in self.slots if s.reply is None and s.kv.cached]
            for slot in idle:
                slot.kv.clear()
            if idle:
                return
            prefilling = [s for s in busy if s.reply is not None and s.reply.pending < 0]
            if not prefilling:
                youngest = max(busy, key=lambda s: s.reply.state.t_start if s.reply else 0.0)
                out.append(SlotEvents(youngest, tuple(self._end(youngest, "length", "context"))))
                return
            for slot in prefilling:
                r = slot.reply
                assert r is not None
                self._release(slot)
                exc: LocalfabError = ContextOverflow(
                    len(r.prompt),
                    slot.kv.n_ctx,
                    "the shared KV cache has no room left for this prompt beside the running "
                    "replies: try again shortly, raise -c or lower -np",
                )
                out.append(SlotEvents(slot, error=exc))
            return
        for slot in busy:
            self._release(slot)
            exc = LocalfabError(f"llama.cpp failed to decode (llama_decode returned {rc})")
            out.append(SlotEvents(slot, error=exc))

    # --- per slot ----------------------------------------------------------------------------

    def _sample(
        self, slot: Slot, logits: np.ndarray[Any, np.dtype[np.float32]], row: int
    ) -> list[TokenEvent | Done]:
        """Take the slot's next token from its logits row: the token step of every path."""
        r = slot.reply
        assert r is not None
        state = r.state
        event = state.step(logits, row)
        if event is None:  # end of generation
            return self._end(slot)
        if state.ended():
            return [event, *self._end(slot)]
        r.pending = event.token
        return [event]

    def _end(
        self, slot: Slot, finish: FinishReason | None = None, stop_type: StopType = "limit"
    ) -> list[TokenEvent | Done]:
        """End the slot's reply: for the reason its state holds, or `finish` / `stop_type`."""
        r = slot.reply
        assert r is not None
        self._release(slot)
        if finish is not None:
            r.state.end(finish, stop_type)
        return r.state.finish()

    def _cancelled(self, slot: Slot) -> list[TokenEvent | Done]:
        r = slot.reply
        assert r is not None
        self._release(slot)
        # The part of the prompt evaluated so far stays cached for the next request.
        state = r.state
        return [cancelled_before_first(slot.kv, state.n_reused, state.t_start, len(r.prompt))]

    def reset(self) -> list[Slot]:
        """After a step that raised: every reply is dropped (their slots are returned) and each
        slot's mirror is cut back to what its sequence holds."""
        dropped = [s for s in self.slots if s.reply is not None]
        for slot in dropped:
            self._release(slot)
        for slot in self.slots:
            slot.kv.sync_after_failure()
        return dropped

    def stop(self, slot: Slot) -> list[TokenEvent | Done]:
        """End the slot's reply now, as cancelled (what it generated is kept)."""
        r = slot.reply
        if r is None:
            return []
        if r.pending < 0:
            return self._cancelled(slot)
        return self._end(slot, "cancelled", "cancel")

    def _release(self, slot: Slot) -> None:
        r = slot.reply
        slot.reply = None
        slot.last_used = time.perf_counter()
        if r is not None and r.state.sampler is not None:
            r.state.sampler.close()
        # A follower waiting on this slot's prompt starts on its own.
        for other in self.slots:
            o = other.reply
            if o is not None and o.leader is slot:
                o.leader = None
                n = other.kv.reuse_prefix(o.prompt)
                o.state.n_reused = n
                o.todo = o.prompt[n:]
