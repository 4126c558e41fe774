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

from localfab.chat.session import fit_turns, next_turn_start


class ChatWindow:
    """The prompt of a chat request, and which of its turns are left out."""

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        render: Callable[[list[Mapping[str, Any]]], str],
        encode: Callable[[str], list[int]],
        n_ctx: int,
    ) -> None:
        self._n_ctx = n_ctx
        self._render = render
        self._encode = encode
        n_head = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        self._head = list(messages[:n_head])
        self._rest = list(messages[n_head:])
        users = [i for i, m in enumerate(self._rest) if m["role"] == "user"]
        self._last_user = users[-1] if users else None
        self._start = 0
        self.text = render(list(messages))
        self.tokens = encode(self.text)
        self.left_out = {"turns": 0, "tokens": 0}  # so far; grows if the reply needs room

    def _prompt(self, start: int) -> tuple[str, list[int]]:
        text = self._render(self._head + self._rest[start:])
        return text, self._encode(text)

    def _leave_out(self, start: int, turns: int, text: str, tokens: list[int]) -> None:
        self.left_out["turns"] += turns
        self.left_out["tokens"] += max(0, len(self.tokens) - len(tokens))
        self._start, self.text, self.tokens = start, text, tokens

    def fit(self, budget: int) -> None:
        """Leave out oldest turns until the prompt fits in `budget` tokens (or one turn is left)."""
        if len(self.tokens) <= budget or self._last_user is None:
            return
        texts = {self._start: self.text}

        def tokens_from(start: int) -> list[int]:
            if start == self._start:
                return self.tokens
            texts[start], tokens = self._prompt(start)
            return tokens

        start, tokens, dropped, _ = fit_turns(
            self._rest, self._start, self._last_user, tokens_from, budget
        )
        if dropped:
            self._leave_out(start, dropped, texts[start], tokens)

    def on_context_full(self, generated: list[int]) -> list[int] | None:
        """The engine's callback when the reply fills the window: the oldest turns leave, as
        many as it takes to fit; None when no whole turn is left to give."""
        if self._last_user is None:
            return None
        start, turns = self._start, 0
        while True:
            nxt = next_turn_start(self._rest, start, self._last_user)
            if nxt is None:
                return None
            start, turns = nxt, turns + 1
            text, tokens = self._prompt(start)
            target = tokens + generated[:-1]
            if len(target) < self._n_ctx:
                self._leave_out(start, turns, text, tokens)
                return target
