"""A chat request's messages fitted to the context window by whole turns.

The OpenAI chat API is stateless: every request carries the whole conversation. When it does not
fit, whole oldest turns are left out (the leading system messages and the last user turn stay),
as a ChatSession's window does, instead of failing; the engine then moves the KV cells of the
kept turns rather than processing them again. A reply that reaches the end of the window makes
room the same way and goes on.

An agent's loop is one long turn: one user message, then tool calls and their results, many of
them. When that turn alone does not fit, its oldest tool exchanges (an assistant message with
calls and the tool results after it) are left out, the user message and the newest exchange
staying.
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
        self._cut = 0  # the last turn's exchanges kept from here (0: all of them)
        self.tokens = prompt(list(messages))
        # So far; grows if the reply needs room.
        self.left_out = {"turns": 0, "exchanges": 0, "tokens": 0}

    def fit(self, budget: int, *, all_or_nothing: bool = False) -> bool:
        """Leave out oldest turns (then the last turn's oldest tool exchanges) until the prompt
        fits in `budget` tokens; True if it fits.

        The last user message and the newest exchange are never left out. With
        `all_or_nothing`, nothing leaves unless the prompt then fits.
        """
        if len(self.tokens) <= budget:
            return True
        user = self._last_user
        if user is None:
            return False

        def tokens_from(start: int) -> list[int]:
            if start == self._start:
                return self.tokens
            return self._prompt(self._head + self._rest[start:])

        start, cut, tokens = self._start, self._cut, self.tokens
        if not cut:  # whole turns first
            start, tokens, _, _ = fit_turns(self._rest, start, user, tokens_from, budget)
        if len(tokens) > budget and start == user:
            cut, tokens = self._fit_exchanges(budget, tokens)
        fits = len(tokens) <= budget
        if (start, cut) != (self._start, self._cut) and (fits or not all_or_nothing):
            gone = self._rest[self._start : start]
            self.left_out["turns"] += sum(m["role"] == "user" for m in gone)
            self.left_out["exchanges"] += len(self._exchanges(until=cut))
            self.left_out["tokens"] += max(0, len(self.tokens) - len(tokens))
            self._start, self._cut, self.tokens = start, cut, tokens
        return fits

    def _exchanges(self, until: int | None = None) -> list[int]:
        """Where the last turn's exchanges still kept start (before `until`, if given)."""
        assert self._last_user is not None
        rest = self._rest
        lo = max(self._last_user + 1, self._cut)
        return [
            i
            for i in range(lo, len(rest) if until is None else until)
            if rest[i]["role"] == "assistant" and rest[i].get("tool_calls")
        ]

    def _fit_exchanges(self, budget: int, tokens: list[int]) -> tuple[int, list[int]]:
        """The last turn alone with as few of its oldest tool exchanges left out as it takes
        to fit (the newest stays): where its kept exchanges start, and the prompt."""
        user = self._last_user
        assert user is not None
        starts = self._exchanges()

        def window(cut: int) -> list[int]:
            return self._prompt(self._head + self._rest[user : user + 1] + self._rest[cut:])

        best: tuple[int, list[int]] | None = None
        lo, hi = 1, len(starts) - 1  # keep from starts[k]: the smallest k that fits
        while lo <= hi:
            k = (lo + hi) // 2
            built = window(starts[k])
            if len(built) <= budget:
                best, hi = (starts[k], built), k - 1
            else:
                lo = k + 1
        if best is None and len(starts) > 1:  # none fits: the newest exchange alone
            best = (starts[-1], window(starts[-1]))
        return best or (self._cut, tokens)

    @property
    def shifted(self) -> bool:
        """Whether messages were left out (the kept ones' KV cells move)."""
        return bool(self.left_out["turns"] or self.left_out["exchanges"])

    def on_context_full(self, generated: list[int]) -> list[int] | None:
        """The engine's callback when the reply fills the window: as few oldest turns leave as
        it takes to go on; None when no whole turn is left to give."""
        tail = generated[:-1]
        if not self.fit(self._n_ctx - 1 - len(tail), all_or_nothing=True):
            return None
        return self.tokens + tail
