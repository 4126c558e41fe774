"""Fitting a conversation into the window by whole turns: the same turns leave as one at a time
would, and the work stays proportional to what is kept, not to the conversation's length."""

from __future__ import annotations

import random

import pytest

from localfab.chat.session import fit_turns, next_turn_start


def _naive(messages, start, last_user, tokens_from, budget):
    """Dropping one oldest turn at a time: the reference for which turns leave."""
    tokens = tokens_from(start)
    n_before, dropped = len(tokens), 0
    while len(tokens) > budget:
        nxt = next_turn_start(messages, start, last_user)
        if nxt is None:
            break
        start, dropped = nxt, dropped + 1
        tokens = tokens_from(start)
    return start, tokens, dropped, n_before


def _conversation(rng: random.Random, n_turns: int) -> tuple[list[dict[str, str]], list[int]]:
    messages: list[dict[str, str]] = []
    sizes: list[int] = []
    for _ in range(n_turns):
        for role in ("user", "assistant") if rng.random() < 0.9 else ("user",):
            messages.append({"role": role, "content": ""})
            sizes.append(rng.randint(1, 60))
    return messages, sizes


class Counting:
    """tokens_from over message sizes, counting the tokens it builds."""

    def __init__(self, sizes: list[int], head: int = 7) -> None:
        self.sizes = sizes
        self.head = head
        self.built = 0
        self.calls = 0

    def __call__(self, start: int) -> list[int]:
        tokens = [0] * (self.head + sum(self.sizes[start:]))
        self.built += len(tokens)
        self.calls += 1
        assert self.calls < 1000, "the prompt was built once per dropped turn"
        return tokens


@pytest.mark.parametrize("seed", range(40))
def test_the_same_turns_leave_as_one_at_a_time(seed: int):
    rng = random.Random(seed)
    messages, sizes = _conversation(rng, rng.randint(1, 60))
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    start = rng.choice([i for i, m in enumerate(messages) if m["role"] == "user"])
    start = min(start, last_user)
    budget = rng.randint(0, 7 + sum(sizes) + 10)
    got = fit_turns(messages, start, last_user, Counting(sizes), budget)
    want = _naive(messages, start, last_user, Counting(sizes), budget)
    assert got == want


def test_a_long_conversation_builds_little_more_than_what_it_keeps():
    """20,000 messages into a window that holds a few dozen: dropping one turn at a time builds
    the whole conversation ~10,000 times (quadratic); the search builds it once, then windows
    not much longer than the one kept."""
    messages = [{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(20000)]
    sizes = [10] * len(messages)
    budget = 1000
    count = Counting(sizes)
    start, tokens, dropped, n_before = fit_turns(messages, 0, 19998, count, budget)
    assert len(tokens) <= budget and n_before == 7 + 200000
    assert len(tokens) + 20 > budget  # as many turns as fit: one more would not
    assert dropped == start // 2 and messages[start]["role"] == "user"
    assert count.calls < 40
    assert count.built - n_before < 20 * budget


def test_only_the_last_turn_is_left_when_nothing_fits():
    messages = [{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(9)]
    count = Counting([50] * 9)
    start, tokens, dropped, _ = fit_turns(messages, 0, 8, count, 10)
    assert (start, dropped) == (8, 4) and len(tokens) == 57
