"""The prompt cache's bookkeeping: which kept state a prompt gets back, what leaves, and when."""

from __future__ import annotations

from localfab.engine.prompt_cache import MIN_TOKENS, PromptCache, common_prefix

A = list(range(100, 200))  # a conversation of 100 tokens
B = list(range(500, 580))  # another of 80


def state(n: int) -> bytearray:
    return bytearray(n)


def test_a_prompt_gets_back_the_state_holding_its_longest_beginning():
    cache = PromptCache(limit=None)
    cache.put(A, state(10))
    cache.put(B, state(10))
    found = cache.take(A + [1, 2, 3], have=0)  # chat A's next turn
    assert found is not None and list(found[0].tokens) == A and found[1] == "ram"
    assert [list(e.tokens) for e in cache.entries] == [B]  # the slot holds A's now
    assert cache.take(A + [1, 2, 3], have=0) is None


def test_a_state_is_taken_only_when_it_beats_what_the_sequence_holds_and_keeps_a_quarter():
    cache = PromptCache(limit=None)
    long = list(range(2000, 2200))
    cache.put(long, state(10))
    assert cache.take(long, have=len(long)) is None  # the sequence already holds as much
    assert cache.take(long[:45] + [7] * 80, have=0) is None  # 45 of 200: under a quarter
    assert cache.take(long[:60] + [7] * 80, have=59) is not None


def test_short_prompts_are_neither_kept_nor_restored():
    cache = PromptCache(limit=None)
    short = A[: MIN_TOKENS - 1]
    assert not cache.worth_keeping(short)
    cache.put(A, state(10))
    assert cache.take(short, have=0) is None  # shares too little to be worth a restore


def test_a_longer_state_replaces_the_states_it_extends_and_a_covered_one_is_not_kept():
    cache = PromptCache(limit=None)
    cache.put(A[:50], state(5))
    cache.put(A, state(10))
    assert [len(e.tokens) for e in cache.entries] == [100]
    assert not cache.worth_keeping(A[:60])  # already the beginning of a kept state
    assert cache.worth_keeping(B)


def test_the_oldest_states_leave_when_the_bytes_run_over_the_limit():
    cache = PromptCache(limit=25)
    cache.put(A, state(10))
    cache.put(B, state(10))
    cache.put(list(range(900, 960)), state(10))
    assert [e.tokens[0] for e in cache.entries] == [500, 900]
    assert cache.nbytes == 20 and cache.stats.evicted == 1
    cache.put(list(range(1000, 1100)), state(30))  # larger than the whole cache: not kept
    assert len(cache.entries) == 2


def test_a_cache_of_no_bytes_is_off():
    cache = PromptCache(limit=0)
    assert not cache.enabled and not cache.worth_keeping(A)
    cache.put(A, state(1))
    assert cache.entries == [] and cache.take(A, have=0) is None


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2
