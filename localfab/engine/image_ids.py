"""Image tokens: the ids an image's positions take in a prompt's token list.

An image in a prompt becomes a run of negative ids, which no vocabulary has: one per position
the image takes, all derived from a hash of the image's content. They sit in a sequence's token
list like text tokens, so what compares prompts works on them unchanged (prefix reuse: the same
image in the next turn is not encoded again; the prompt cache; the choice of a slot), and a
different image differs at its first position. Pure arithmetic, no llama.cpp: `engine.vision`
turns images into these ids and evaluates runs of them.

A request's prompt keeps its images prepared until it has been evaluated: `ImageHold` pins
them (the projector frees only images no hold pins), and `HeldTokens` carries the hold with
the prompt's tokens to the jobs that run it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
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


# How a projector lets go of a hold's images: (the images' first ids, whether the call may wait
# for the projector's lock: not when the collector runs it, which may be inside that lock).
Unpin = Callable[[set[int], bool], None]


class ImageHold:
    """The images one request's prompt refers to, pinned: the projector does not free them to
    make room for others until the prompt has been evaluated. That is once the jobs that run
    it have ended (`enter`/`leave`), or, for a prompt no job took (a request refused early, a
    template applied), once the hold is dropped."""

    def __init__(self, unpin: Unpin) -> None:
        self.firsts: set[int] = set()  # the images' first ids (what the projector pins)
        self.n_tokens = 0  # the tokens those images take
        self._unpin = unpin
        self._jobs = 0
        self._lock = threading.Lock()
        # Dropped without a release: the collector's call may come inside the projector's lock.
        self._dropped = weakref.finalize(self, unpin, self.firsts, False)
        self._dropped.atexit = False  # at exit the projector may be gone

    def __len__(self) -> int:
        return len(self.firsts)

    def enter(self) -> None:
        """A job takes the prompt: its images stay pinned until that job `leave`s."""
        with self._lock:
            self._jobs += 1

    def leave(self) -> None:
        """A job that took the prompt ended; the last one lets the images go."""
        with self._lock:
            self._jobs -= 1
            last = self._jobs <= 0
        if last:
            self.release()

    def release(self) -> None:
        """Let the images go now (once; later calls do nothing)."""
        if self._dropped.detach() is not None:
            self._unpin(self.firsts, True)


class HeldTokens(list[int]):
    """A prompt's tokens with the hold on its images: a job given them keeps the images
    prepared while it runs (`server.jobs.Job`). A copy or a slice is a plain list."""

    def __init__(self, tokens: Iterable[int], hold: ImageHold) -> None:
        super().__init__(tokens)
        self.hold = hold
