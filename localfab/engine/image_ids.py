"""Image tokens: the ids an image's positions take in a prompt's token list.

An image in a prompt becomes a run of negative ids, which no vocabulary has: one per position
the image takes, all derived from a hash of the image's content. They sit in a sequence's token
list like text tokens, so what compares prompts works on them unchanged (prefix reuse: the same
image in the next turn is not encoded again; the prompt cache; the choice of a slot), and a
different image differs at its first position. Pure arithmetic, no llama.cpp: `engine.vision`
turns images into these ids and evaluates runs of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# Positions one image may take (the largest projectors give a few thousand tokens per image).
SPAN = 1 << 13
# Distinct image keys: ids stay within int32 (llama.cpp stores a state's tokens as int32). Two
# images share a key once in 2^18 pairs; the key also carries the run's length (`run_ids`).
KEYS = (1 << 18) - 1


class Images(Protocol):
    """What evaluates a prompt's image runs (`vision.Projector`), as a sequence sees it."""

    def decode(self, kv: Any, tokens: Sequence[int], start: int, *, logits_last: bool) -> None:
        """Evaluate `tokens` (text and image runs) at positions start.. of `kv`'s sequence."""

    def close(self) -> None:
        """Free what it holds (before the model it belongs to)."""


def run_ids(digest: str, n_tokens: int) -> list[int]:
    """The ids of an image whose content hash is `digest` (hex) and which takes `n_tokens`."""
    if not 0 < n_tokens <= SPAN:
        raise ValueError(f"an image of {n_tokens} tokens (at most {SPAN})")
    key = (int(digest[:16], 16) ^ n_tokens) % KEYS + 1
    return [-(key * SPAN + i) for i in range(n_tokens)]


def is_image(token: int) -> bool:
    return token < 0


def index_in_image(token: int) -> int:
    """Which position of its image an image token is (0: the first)."""
    return -token % SPAN


def image_start(tokens: Sequence[int], n: int) -> int:
    """`n`, or where the image that position `n` falls inside begins: a cut before `n` never
    keeps part of an image."""
    if 0 <= n < len(tokens) and tokens[n] < 0:
        return n - index_in_image(tokens[n])
    return n


def image_end(tokens: Sequence[int], n: int) -> int:
    """`n`, or where the image that position `n` falls inside ends."""
    while 0 < n < len(tokens) and tokens[n] < 0 and index_in_image(tokens[n]) > 0:
        n += 1
    return n
