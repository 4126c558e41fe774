"""Speculative decoding on the batched slots (`engine.batch`): each reply drafts from its own
history, or in its own sequence of the draft model, and its drafted tokens ride in the step's
batch after its pending token, each with its logits (the verify). One cost line, measured per
step, serves every slot's tuner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localfab.engine.kvcache import KVCache
from localfab.engine.spec.drafters import Drafter, ModelDraft, NgramDraft
from localfab.engine.spec.tuner import SpecCosts, Tuner, propose

if TYPE_CHECKING:
    from localfab.engine.spec.loop import Speculator


@dataclass(eq=False)
class SlotSpec:
    """A reply's speculation on its slot: the drafter, the tuner and what was drafted."""

    drafter: Drafter
    tuner: Tuner
    n_pushed: int = 0  # generated tokens the drafter has seen
    drafts: list[int] = field(default_factory=list)  # in this step's batch after the pending
    guess: int = -1  # a free one-token guess made while not drafting (-1: none)


class SlotSpeculation:
    """The engine's speculator as the slots use it: drafters per reply, a shared cost line."""

    def __init__(self, speculator: Speculator, n_slots: int) -> None:
        self.speculator = speculator
        self.costs = SpecCosts()  # what a step costs, with and without drafts
        self.draft_kv: dict[int, KVCache] = {}  # the draft model's sequence of each slot
        draft = speculator.draft_engine
        if draft is not None:
            self.draft_kv[0] = draft.kv
            for i in range(1, min(n_slots, draft.n_seq_max)):
                kv = KVCache(
                    draft.ctx, draft.n_ctx, draft.n_batch, draft.n_vocab, seq=i, shared=True
                )
                kv.clear()  # cells an earlier decoder left in this sequence: not mirrored
                self.draft_kv[i] = kv

    def close(self) -> None:
        """Free the draft model's sequences but its own (sequence 0)."""
        for i, kv in self.draft_kv.items():
            if i:
                kv.free()
        self.draft_kv.clear()

    def new(self, slot_id: int, prompt: Sequence[int]) -> SlotSpec | None:
        """A reply's speculation on slot `slot_id`; None for a slot beyond the draft model's
        sequences."""
        sp = self.speculator
        drafter: Drafter
        if sp.draft_engine is None:
            drafter = NgramDraft()
        elif slot_id in self.draft_kv:
            drafter = ModelDraft(sp.draft_engine, sp.settings.draft_p_min, self.draft_kv[slot_id])
        else:
            return None
        drafter.reset(prompt)
        s = sp.settings
        tuner = Tuner(self.costs, adaptive=s.adaptive, k_max=s.max_draft, cheap=drafter.cheap)
        return SlotSpec(drafter, tuner)

    def draft(
        self, spec: SlotSpec, generated: Sequence[int], kv: KVCache, room: int, max_tokens: int
    ) -> list[int]:
        """The tokens to verify after the slot's pending one, at most `room` (as
        `Speculator.run` drafts); kept in `spec.drafts`."""
        sp = self.speculator
        s = sp.settings
        for tok in generated[spec.n_pushed :]:
            spec.drafter.push(tok)
        spec.n_pushed = len(generated)
        n = len(kv.cached)
        room = min(room, kv.n_ctx - n - 1, sp.limit(n) - 1)
        if max_tokens > 0:
            room = min(room, max_tokens - len(generated) - 1)
        drafts = propose(spec.tuner, spec.drafter, min(room, s.max_draft))
        if len(drafts) < max(s.draft_min, 1):
            drafts = []
        spec.guess = -1
        if not drafts and spec.drafter.cheap and s.adaptive:
            guess = spec.drafter.draft(1)
            spec.guess = guess[0] if guess else -1
        spec.drafts = drafts
        return drafts

    def took(self, seconds: float, n_draft: int) -> None:
        """A step with no prompt in it took `seconds` and verified `n_draft` drafted tokens."""
        if n_draft:
            self.costs.took_verify(seconds, n_draft)
        else:
            self.costs.took_one(seconds)
