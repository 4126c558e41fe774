"""Idle prompts kept in RAM: the KV state of a sequence, keyed by its tokens, to restore later.

When a sequence is about to drop most of what it holds for an unrelated prompt (another chat
taking its turn on a server slot, a title request between two turns), its state is copied here
first; when a prompt comes whose beginning a kept state holds, that state goes back into the
sequence and only the rest of the prompt is processed. As llama-server's `--cache-ram`: the
longest common prefix wins, a state is only taken when it keeps at least a quarter of what it
holds, a kept state leaves the cache while a sequence holds it, and the oldest go first when the
bytes run over the limit. The states themselves are llama.cpp's (`KVCache.save_state`); this
module is plain bookkeeping.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

# A kept state is taken only when the new prompt keeps at least this share of it (llama-server
# skips states whose f_keep is under 0.25: restoring them would throw most of them away).
MIN_KEEP = 0.25
# States shorter than this are not worth a copy: processing them again costs about as much.
MIN_TOKENS = 32
# llama-server's default --cache-ram (8 GiB); less where half the free RAM is less.
DEFAULT_LIMIT = 8 << 30


def default_limit() -> int:
    """The bytes a prompt cache may hold on this machine when nobody says: llama-server's 8 GiB,
    or half the RAM free now when that is less."""
    import psutil

    return min(DEFAULT_LIMIT, int(psutil.virtual_memory().available) // 2)


@dataclass
class CachedPrompt:
    """One kept state: the tokens its cells hold, in order, and llama.cpp's bytes of it."""

    tokens: tuple[int, ...]
    state: bytearray

    @property
    def nbytes(self) -> int:
        return len(self.state)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CacheStats:
    """What the cache has done since it was made (for /metrics, /slots and `-v`)."""

    saved: int = 0  # states kept
    hits: int = 0  # states restored into a sequence
    tokens_restored: int = 0  # prompt tokens those states spared processing
    evicted: int = 0
    failed: int = 0  # states llama.cpp refused to restore (then processed as usual)


@dataclass
class PromptCache:
    """Kept states, oldest first, within `limit` bytes (None: no limit)."""

    limit: int | None
    entries: list[CachedPrompt] = field(default_factory=list)
    stats: CacheStats = field(default_factory=CacheStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def enabled(self) -> bool:
        return self.limit is None or self.limit > 0

    def worth_keeping(self, tokens: Sequence[int]) -> bool:
        """Whether a sequence holding `tokens` should be kept before it is overwritten: long
        enough, and not already the beginning of a kept state."""
        if not self.enabled or len(tokens) < MIN_TOKENS:
            return False
        with self._lock:
            return not any(
                len(e.tokens) >= len(tokens) and common_prefix(e.tokens, tokens) == len(tokens)
                for e in self.entries
            )

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        """Keep `state` (of a sequence holding `tokens`); states it extends leave, and the
        oldest leave while the total is over the limit."""
        if not self.enabled or (self.limit is not None and len(state) > self.limit):
            return
        entry = CachedPrompt(tuple(tokens), state)
        with self._lock:
            self.entries = [
                e
                for e in self.entries
                if not (
                    len(e.tokens) <= len(entry.tokens)
                    and common_prefix(e.tokens, entry.tokens) == len(e.tokens)
                )
            ]
            self.entries.append(entry)
            self.stats.saved += 1
            while self.limit is not None and self.nbytes > self.limit and len(self.entries) > 1:
                self.entries.pop(0)
                self.stats.evicted += 1

    def take(self, prompt: Sequence[int], have: int) -> CachedPrompt | None:
        """The kept state that holds the longest beginning of `prompt`, longer than the `have`
        tokens the sequence already holds, and keeps at least `MIN_KEEP` of it; it leaves the
        cache (the sequence holds it now). None when no state is worth restoring."""
        with self._lock:
            best: CachedPrompt | None = None
            best_lcp = max(have, MIN_TOKENS - 1)
            for e in self.entries:
                lcp = common_prefix(e.tokens, prompt)
                if lcp > best_lcp and lcp >= MIN_KEEP * len(e.tokens):
                    best, best_lcp = e, lcp
            if best is not None:
                self.entries.remove(best)
            return best

    def restored(self, n_tokens: int) -> None:
        with self._lock:
            self.stats.hits += 1
            self.stats.tokens_restored += n_tokens

    def refused(self) -> None:
        with self._lock:
            self.stats.failed += 1
