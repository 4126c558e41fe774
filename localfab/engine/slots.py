"""The slots of continuous batching (`batch`): a KV sequence each, the reply it runs, what a
step gave it, and which idle slot a new prompt goes to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localfab.engine.kvcache import KVCache
from localfab.engine.reply import ReplyState
from localfab.engine.spec.slots import SlotSpec
from localfab.engine.types import Done, TokenEvent
from localfab.errors import LocalfabError

__all__ = ["Slot", "SlotEvents", "SlotReply", "choose_slot"]

# A cached prefix this share of the new prompt (or more) sends it to that slot; below it the
# least recently used idle slot is taken (llama-server's --slot-prompt-similarity default).
PROMPT_SIMILARITY = 0.1


@dataclass(eq=False)
class SlotReply:
    """One reply on a slot: its prompt and how far it is; its tokens are `state`'s."""

    prompt: list[int]
    todo: list[int]  # prompt tokens not evaluated yet
    state: ReplyState  # the token step, as on every path
    pending: int = -1  # the sampled token the next step decodes; -1 while the prompt runs
    leader: Slot | None = None  # a follower's: the slot whose prompt cells it copies
    spec: SlotSpec | None = None  # speculative decoding, when the engine has it on


@dataclass(eq=False)
class Slot:
    """One KV sequence and the reply it is running (None: idle)."""

    id: int
    kv: KVCache
    reply: SlotReply | None = None
    last_used: float = 0.0

    @property
    def busy(self) -> bool:
        return self.reply is not None

    @property
    def n_evaluated(self) -> int:
        """Prompt tokens in the cache so far (prompt progress)."""
        r = self.reply
        return 0 if r is None else len(r.prompt) - len(r.todo)


@dataclass(frozen=True)
class SlotEvents:
    """What one step gave a slot: its new token and, if the reply ended, its Done; or the
    error that ended it (the slot is idle again either way once the reply is over)."""

    slot: Slot
    events: tuple[TokenEvent | Done, ...] = ()
    error: LocalfabError | None = None


def choose_slot(idle: list[Slot], prompt: Sequence[int]) -> Slot | None:
    """The idle slot for `prompt`; None when all are busy.

    As llama-server: the slot whose cache shares the longest prefix with it, when that is
    a fair share of the prompt (and more than the BOS), else the least recently used. One
    guard more: a prefix under half the prompt is taken only when it saves at least as
    many tokens as it throws away of that slot's cache, so a short prompt that shares a
    word or two with a cached conversation does not evict it.
    """
    if not idle:
        return None
    lru = min(idle, key=lambda s: s.last_used)
    best = max(idle, key=lambda s: s.kv.common_prefix(prompt))
    lcp = best.kv.common_prefix(prompt)
    if lcp <= 1 or lcp < PROMPT_SIMILARITY * len(prompt):
        return lru
    if 2 * lcp >= len(prompt):
        return best
    saved = lcp - lru.kv.common_prefix(prompt)
    lost = len(best.kv.cached) - lcp
    return best if saved >= lost else lru
