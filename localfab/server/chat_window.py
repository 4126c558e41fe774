"""A chat request's messages fitted to the context window by whole turns.

The OpenAI chat API is stateless: every request carries the whole conversation. When it does not
fit, whole oldest turns are left out (the leading system messages and the last user turn stay),
as a ChatSession's window does, instead of failing; the engine then moves the KV cells of the
kept turns rather than processing them again. A reply that reaches the end of the window makes
room the same way and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from localfab.chat.session import fit_turns


class ChatWindow:
    """The prompt of a chat request, and which of its turns are left out."""

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        prompt: Callable[[Sequence[Mapping[str, Any]]], list[int]],
        n_ctx: int,
    ) -> None:
        """`prompt(messages)` is the prompt tokens of (part of) the conversation."""
        self._n_ctx = n_ctx
        self._prompt = prompt
        n_head = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        self._head = list(messages[:n_head])
        self._rest = list(messages[n_head:])
        users = [i for i, m in enumerate(self._rest) if m["role"] == "user"]
        self._last_user = users[-1] if users else None
        self._start = 0
        self.tokens = prompt(list(messages))
        self.left_out = {"turns": 0, "tokens": 0}  # so far; grows if the reply needs room

    def fit(self, budget: int, *, all_or_nothing: bool = False) -> bool:
        """Leave out oldest turns until the prompt fits in `budget` tokens; True if it fits.

        Only the last turn is never left out. With `all_or_nothing`, no turn leaves unless the
        prompt then fits.
        """
        if len(self.tokens) <= budget:
            return True
        if self._last_user is None:
            return False

        def tokens_from(start: int) -> list[int]:
            if start == self._start:
                return self.tokens
            return self._prompt(self._head + self._rest[start:])

        start, tokens, dropped, _ = fit_turns(
            self._rest, self._start, self._last_user, tokens_from, budget
        )
        fits = len(tokens) <= budget
        if dropped and (fits or not all_or_nothing):
            self.left_out["turns"] += dropped
            self.left_out["tokens"] += max(0, len(self.tokens) - len(tokens))
            self._start, self.tokens = start, tokens
        return fits

    def on_context_full(self, generated: list[int]) -> list[int] | None:
        """The engine's callback when the reply fills the window: as few oldest turns leave as
        it takes to go on; None when no whole turn is left to give."""
        tail = generated[:-1]
        if not self.fit(self._n_ctx - 1 - len(tail), all_or_nothing=True):
            return None
        return self.tokens + tail
