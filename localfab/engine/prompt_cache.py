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

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localfab.engine.cached import (
    MIN_KEEP,
    MIN_TOKENS,
    CachedPrompt,
    begins_with,
    common_prefix,
    worth_taking,
)
from localfab.engine.disk_cache import DiskCache, Note, StateKey
from localfab.units import PROMPT_CACHE_RAM

__all__ = [
    "MIN_KEEP",
    "MIN_TOKENS",
    "CacheStats",
    "CachedPrompt",
    "PromptCache",
    "Restored",
    "common_prefix",
    "default_limit",
    "open_prompt_cache",
]

# llama-server's default --cache-ram (8 GiB); less where half the free RAM is less.
DEFAULT_LIMIT = PROMPT_CACHE_RAM


def default_limit() -> int:
    """The bytes a prompt cache may hold on this machine when nobody says: llama-server's 8 GiB,
    or half the RAM free now when that is less."""
    import psutil

    return min(DEFAULT_LIMIT, int(psutil.virtual_memory().available) // 2)


def open_prompt_cache(
    ram: int | None,
    *,
    key: StateKey | None = None,
    folder: Path | None = None,
    disk_limit: int = 0,
    note: Note | None = None,
) -> PromptCache:
    """A prompt cache of `ram` bytes (None: no limit, 0: none in RAM), with a disk tier in
    `folder` for states of `key` when both are given and `disk_limit` is above 0."""
    disk = None
    if key is not None and folder is not None and disk_limit > 0:
        disk = DiskCache(folder, key, disk_limit)
        if note is not None:
            disk.note = note
    return PromptCache(ram, disk=disk)


@dataclass
class CacheStats:
    """What the cache has done since it was made (for /metrics, /slots and `-v`)."""

    saved: int = 0  # states kept
    hits: int = 0  # states restored into a sequence
    tokens_restored: int = 0  # prompt tokens those states spared processing
    evicted: int = 0
    failed: int = 0  # states llama.cpp refused to restore (then processed as usual)
    disk_hits: int = 0  # of the hits, states read from the disk tier
    disk_written: int = 0  # state files written


@dataclass(frozen=True)
class Restored:
    """What a restore gave a prompt: its first `n_tokens` from a kept state, in `seconds`,
    from "ram" or "disk"."""

    n_tokens: int
    seconds: float
    tier: str


@dataclass
class PromptCache:
    """Kept states, oldest first, within `limit` bytes of RAM (None: no limit), and on disk
    when `disk` is given (`disk_cache`: kept across restarts, shared by processes)."""

    limit: int | None
    disk: DiskCache | None = None
    entries: list[CachedPrompt] = field(default_factory=list)
    stats: CacheStats = field(default_factory=CacheStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _writes: queue.Queue[tuple[tuple[int, ...], bytearray] | None] | None = None

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def in_ram(self) -> bool:
        return self.limit is None or self.limit > 0

    @property
    def enabled(self) -> bool:
        return self.in_ram or self.disk is not None

    def clear(self) -> None:
        """Forget the states kept in RAM (a sleeping server's; the disk tier keeps its files)."""
        with self._lock:
            self.entries.clear()

    def beside(self, key: StateKey) -> PromptCache:
        """A cache for another model's states beside this one's (a draft model's): the same
        limits, its own entries, its own files (`key`) in the same folder."""
        disk = self.disk
        if disk is not None:
            disk = DiskCache(disk.folder, key, disk.limit, disk.note)
        return PromptCache(self.limit, disk=disk)

    def worth_keeping(self, tokens: Sequence[int]) -> bool:
        """Whether a sequence holding `tokens` should be kept before it is overwritten: long
        enough, and not already the beginning of a kept state."""
        if not self.enabled or len(tokens) < MIN_TOKENS:
            return False
        with self._lock:
            return not any(begins_with(e.tokens, tokens) for e in self.entries)

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        """Keep `state` (of a sequence holding `tokens`); states it extends leave, and the
        oldest leave while the total is over the limit. With a disk tier the state is also
        written there, by a thread of its own (the caller goes on at once)."""
        if self.disk is not None:
            self._write_later(tuple(tokens), state)
        if not self.in_ram or (self.limit is not None and len(state) > self.limit):
            return
        entry = CachedPrompt(tuple(tokens), state)
        with self._lock:
            self.entries = [e for e in self.entries if not begins_with(entry.tokens, e.tokens)]
            self.entries.append(entry)
            self.stats.saved += 1
            while self.limit is not None and self.nbytes > self.limit and len(self.entries) > 1:
                self.entries.pop(0)
                self.stats.evicted += 1

    def take(self, prompt: Sequence[int], have: int) -> tuple[CachedPrompt, str] | None:
        """The kept state that holds the longest beginning of `prompt`, longer than the `have`
        tokens the sequence already holds, and keeps at least `MIN_KEEP` of it, with its tier
        ("ram" or "disk"). A state from RAM leaves it (the sequence holds it now); a disk file
        stays. None when no state is worth restoring."""
        with self._lock:
            best: CachedPrompt | None = None
            best_lcp = have
            for e in self.entries:
                lcp = common_prefix(e.tokens, prompt)
                if worth_taking(lcp, len(e.tokens), best_lcp):
                    best, best_lcp = e, lcp
        # The disk only for what saves more than a short prompt's processing.
        if self.disk is not None and best_lcp + MIN_TOKENS <= len(prompt):
            found = self.disk.find(prompt, best_lcp)
            if found is not None:
                entry = self.disk.load(found[0])
                if entry is not None:
                    return entry, "disk"
        if best is None:
            return None
        with self._lock:
            if best in self.entries:
                self.entries.remove(best)
                return best, "ram"
        return None

    def restored(self, n_tokens: int, tier: str) -> None:
        with self._lock:
            self.stats.hits += 1
            self.stats.tokens_restored += n_tokens
            self.stats.disk_hits += tier == "disk"

    def refused(self, entry: CachedPrompt) -> None:
        """llama.cpp would not take `entry` (another layout than its key said): counted, and a
        disk file of it deleted with a note, never tried again."""
        with self._lock:
            self.stats.failed += 1
        if entry.source is not None and self.disk is not None:
            self.disk.discard(entry.source, "llama.cpp refused the state: stale")

    # --- the disk tier --------------------------------------------------------------------------

    def on_disk(self, tokens: Sequence[int], slack: int = 0) -> bool:
        """Whether the disk tier holds `tokens` already, all but their last `slack` at least
        (True without a disk tier: nothing to write)."""
        self.flush()
        n = max(0, len(tokens) - slack)
        return self.disk is None or n < MIN_TOKENS or self.disk.covered(tokens[:n])

    def store(self, tokens: Sequence[int], state: bytearray, *, new: bool = False) -> int:
        """Write `state` to the disk tier now (an app quitting, `run` ending); the bytes
        written (0: none). `new`: `on_disk` has just said no file holds it."""
        if self.disk is None:
            return 0
        self.flush()
        n = self.disk.store(tokens, state, new=new)
        self.stats.disk_written += n > 0
        return n

    def _write_later(self, tokens: tuple[int, ...], state: bytearray) -> None:
        if self._writes is None:
            self._writes = queue.Queue()
            threading.Thread(target=self._writer, name="prompt-cache-writer", daemon=True).start()
        self._writes.put((tokens, state))

    def _writer(self) -> None:
        writes = self._writes
        assert writes is not None and self.disk is not None
        while True:
            item = writes.get()
            try:
                if item is not None:
                    self.stats.disk_written += self.disk.store(*item) > 0
            finally:
                writes.task_done()

    def flush(self) -> None:
        """Wait until the states handed to the disk tier are written."""
        if self._writes is not None:
            self._writes.join()
