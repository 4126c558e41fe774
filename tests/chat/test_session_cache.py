"""Switching chats on one engine with a prompt cache: the chat left is kept, and coming back to
it restores its window instead of processing it again."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatEvent, ChatSession, Reply
from localfab.engine import Engine, EngineSettings, GenerationOptions, SamplingParams
from localfab.engine.prompt_cache import PromptCache

OPTIONS = GenerationOptions(max_tokens=12, sampling=SamplingParams.greedy())
SYSTEM_A = "You are a terse assistant for a lighthouse keeper. " * 4
SYSTEM_B = "You answer questions about baking bread, briefly. " * 4


def reply_of(events: Iterable[ChatEvent]) -> Reply:
    return [e for e in events if isinstance(e, Reply)][-1]


def switch_back(engine: Engine, history: History) -> tuple[Reply, tuple[int, int]]:
    """Chat A, then chat B, then A again (reopened from the history) and its next turn; with
    the tokens of A's window and how many of them came from the cache when it was reopened."""
    prompts = PromptBuilder(engine)
    a = ChatSession(engine, prompts, system=SYSTEM_A, history=history)
    a.session_id = history.create_session(model="m", system=SYSTEM_A)
    reply_of(a.send("When is the lamp lit?", OPTIONS))
    b = ChatSession(engine, prompts, system=SYSTEM_B, history=history)
    b.session_id = history.create_session(model="m", system=SYSTEM_B)
    reply_of(b.send("How long does dough rise?", OPTIONS))
    evaluate, reopened = engine.evaluate, []

    def counted(tokens: list[int]) -> int:
        reopened.append((len(tokens), evaluate(tokens)))
        return reopened[-1][1]

    engine.evaluate = counted  # type: ignore[method-assign]
    try:
        again = ChatSession.resume(history, a.session_id, engine, prompts)
    finally:
        del engine.evaluate
    assert len(reopened) == 1
    return reply_of(again.send("And when is it put out?", OPTIONS)), reopened[0]


def test_coming_back_to_a_chat_restores_its_window(model_path: Path, tmp_path: Path) -> None:
    with Engine(model_path, EngineSettings(n_ctx=2048)) as engine:
        plain, (n_plain, reused_plain) = switch_back(engine, History(tmp_path / "plain.sqlite3"))
        cache = PromptCache(limit=None)
        engine.use_prompt_cache(cache)
        engine.clear_cache()
        cached, (n, reused) = switch_back(engine, History(tmp_path / "cached.sqlite3"))
    assert n == n_plain > 100
    assert cache.stats.hits == 1 and cache.stats.tokens_restored == reused
    # Reopening A processed only the end of its window (the stored reply, tokenized again,
    # may differ from the tokens generated from its first one: at most its 12 tokens and the
    # turn's end), where without the cache it processed all of it but the beginning the two
    # chats' prompts share.
    assert reused >= n - OPTIONS.max_tokens - 4 and reused_plain < 10
    assert cached.text == plain.text
