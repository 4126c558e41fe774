"""How a conversation is fitted into the context window: whole oldest turns leave it.

`reply_room` is the room kept free for the reply; `fit_turns` finds the fewest oldest turns to
drop so that the rest fits. The chat session and the server's chat endpoint both fit with these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Default room kept free for the reply when fitting the window: a quarter of the context
# (llama-server's n_keep/n_discard halves the window on overflow; a quarter keeps more history
# while leaving a reply of useful length before a shift during generation is needed).
REPLY_RESERVE_FRACTION = 4


def reply_reserve_for(n_ctx: int, reserve: int | None = None) -> int:
    """The room a chat keeps free for its replies: `reserve`, else a quarter of the context."""
    return n_ctx // REPLY_RESERVE_FRACTION if reserve is None else reserve


def reply_room(n_ctx: int, max_tokens: int, reserve: int | None = None) -> int:
    """Tokens kept free for the reply when a chat is fitted into the window: `reserve` (else a
    quarter of the context), or the reply's `max_tokens` when that is less. The chat session and
    the server's chat endpoint both fit with this rule."""
    base = reply_reserve_for(n_ctx, reserve)
    return min(base, max_tokens) if max_tokens > 0 else base


def next_turn_start(messages: Sequence[Mapping[str, Any]], start: int, last: int) -> int | None:
    """Index of the user message that starts the turn after `start`, up to `last`."""
    for i in range(start + 1, last + 1):
        if messages[i]["role"] == "user":
            return i
    return None


def fit_turns(
    messages: Sequence[Mapping[str, Any]],
    start: int,
    last_user: int,
    tokens_from: Callable[[int], list[int]],
    budget: int,
) -> tuple[int, list[int], int, int]:
    """Drop whole oldest turns of `messages` until the prompt fits in `budget` tokens.

    `tokens_from(i)` is the prompt of the system prompt plus messages[i:]; turns start at user
    messages and the one at `last_user` always stays. Returns (first kept message, its prompt,
    turns dropped, tokens of the prompt before dropping); the prompt may still exceed the
    budget when only the last turn is left.

    As few turns as possible are dropped. A prompt only grows with the turns it holds, so the
    first turn to keep is searched for from the newest turn backwards, doubling the step and
    then halving it: the prompts built are never much longer than the one that fits, however
    long the conversation is (dropping one turn at a time from the oldest would build the
    whole conversation once per dropped turn). Where a template makes a prompt shorter with
    more turns (one that puts the system prompt into the first user turn, say), the search
    can keep fewer turns than the oldest start that fits; what it keeps always fits.
    """
    tokens = tokens_from(start)
    n_before = len(tokens)
    if len(tokens) <= budget:
        return start, tokens, 0, n_before
    starts = [i for i in range(start + 1, last_user + 1) if messages[i]["role"] == "user"]
    if not starts:
        return start, tokens, 0, n_before
    built: dict[int, list[int]] = {}

    def fits(k: int) -> bool:  # the window that starts at turn starts[k]
        built[k] = tokens_from(starts[k])
        return len(built[k]) <= budget

    fit = len(starts) - 1  # the last turn: kept even when it does not fit
    if fits(fit):
        short = -1  # a turn known not to fit (-1: the window as it was)
        step = 1
        while fit - step > short:
            if not fits(fit - step):
                short = fit - step
                break
            fit -= step
            step *= 2
        while fit - short > 1:
            mid = (short + fit) // 2
            if fits(mid):
                fit = mid
            else:
                short = mid
    return starts[fit], built[fit], fit + 1, n_before
