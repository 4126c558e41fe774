"""What both tiers of the prompt cache share: a kept state and the rules for taking one.

`prompt_cache` keeps states in RAM, `disk_cache` in the cache folder; both pick a state for a
prompt the way llama-server's `--cache-ram` does (`worth_taking`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# A kept state is taken only when the new prompt keeps at least this share of it (llama-server
# skips states whose f_keep is under 0.25: restoring them would throw most of them away).
MIN_KEEP = 0.25
# States shorter than this are not worth a copy: processing them again costs about as much.
MIN_TOKENS = 32


@dataclass
class CachedPrompt:
    """One kept state: the tokens its cells hold, in order, and llama.cpp's bytes of it."""

    tokens: tuple[int, ...]
    state: bytearray
    source: Path | None = None  # the disk tier's file it was read from

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


def begins_with(tokens: Sequence[int], head: Sequence[int]) -> bool:
    """Whether `tokens` begin with all of `head` (a kept state holding `head` and more)."""
    return len(tokens) >= len(head) and common_prefix(tokens, head) == len(head)


def worth_taking(lcp: int, n_kept: int, best: int) -> bool:
    """Whether a kept state of `n_kept` tokens sharing `lcp` with the prompt beats `best` (what
    the sequence or a better state already gives) and keeps at least `MIN_KEEP` of itself."""
    return lcp > max(best, MIN_TOKENS - 1) and lcp >= MIN_KEEP * n_kept
