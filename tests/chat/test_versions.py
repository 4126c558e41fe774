"""ChatSession versions: regenerate a reply, edit a prompt, switch versions.

The real test model runs them (the `model` tier); the last tests check the refusals on the
fake engine, which needs no model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatEvent, ChatSession, Reply
from localfab.engine import Engine, SamplingParams, TokenEvent
from localfab.engine.types import GenerationOptions
from localfab.errors import ContextOverflow, UsageError
from tests.fake_engine import FakeEngine

GREEDY = SamplingParams.greedy()
SYSTEM = "You are a terse assistant for a lighthouse keeper."


@pytest.fixture(scope="module")
def small_engine(model_path: Path) -> Iterator[Engine]:
    from localfab.engine import EngineSettings

    eng = Engine(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    yield eng
    eng.close()


def reply_of(events: Iterable[ChatEvent]) -> Reply:
    replies = [e for e in events if isinstance(e, Reply)]
    assert len(replies) == 1
    return replies[0]


def chat_with_two_turns(engine: Engine, tmp_path: Path) -> tuple[ChatSession, History]:
    engine.clear_cache()
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(
        engine, PromptBuilder(engine), system=SYSTEM, history=history, max_continues=0
    )
    for text in ("Where is the lamp?", "How bright is it?"):
        reply_of(session.send(text, GenerationOptions(max_tokens=12, sampling=GREEDY)))
    return session, history


def sid(session: ChatSession) -> int:
    assert session.session_id is not None
    return session.session_id


def cache_matches_window(engine: Engine, session: ChatSession) -> bool:
    window = session.prompts.tokens(session.window())
    cached = engine.cached_tokens
    return len(cached) > 20 and cached == window[: len(cached)]


@pytest.mark.model
def test_regenerate_stores_a_new_version_of_the_reply(small_engine: Engine, tmp_path: Path) -> None:
    session, history = chat_with_two_turns(small_engine, tmp_path)
    old = history.messages(sid(session))
    sampling = SamplingParams(temperature=1.5, seed=7)
    reply = reply_of(
        session.regenerate(options=GenerationOptions(max_tokens=12, sampling=sampling))
    )
    path = history.messages(sid(session))
    assert [m.id for m in path[:3]] == [m.id for m in old[:3]]
    assert path[-1].id != old[-1].id and path[-1].content == reply.text
    assert (path[-1].version, path[-1].versions) == (2, 2)
    assert path[-1].status in ("length", "complete")
    assert [m.id for m in history.siblings(old[-1].id)] == [old[-1].id, path[-1].id]
    assert session.messages[-1]["content"] == reply.text and len(session.messages) == 4
    # The prompt up to the reply was still in the KV cache.
    assert reply.pieces[0].timings.cache_n > 20
    history.close()


@pytest.mark.model
def test_edit_makes_a_new_version_and_switching_goes_back(
    small_engine: Engine, tmp_path: Path
) -> None:
    session, history = chat_with_two_turns(small_engine, tmp_path)
    before = [dict(m) for m in session.messages]
    reply = reply_of(
        session.edit(2, "Who keeps it?", GenerationOptions(max_tokens=12, sampling=GREEDY))
    )
    assert [m["content"] for m in session.messages[2:]] == ["Who keeps it?", reply.text]
    assert reply.pieces[0].timings.cache_n > 20  # the first turn was reused
    stored = history.messages(sid(session))
    assert (stored[2].version, stored[2].versions) == (2, 2)
    assert len(history.all_messages(sid(session))) == 6
    # Back to the first version: the old prompt and its reply, and a cache that matches.
    path = session.switch_version(2, -1)
    assert session.messages == before and [m.content for m in path] == [
        m["content"] for m in before
    ]
    assert cache_matches_window(small_engine, session)
    again = reply_of(
        session.send("And at night?", GenerationOptions(max_tokens=8, sampling=GREEDY))
    )
    assert again.pieces[0].timings.cache_n > 20  # the rebuilt window was reused
    # Forward again: the edited branch as it was left.
    session.switch_version(2, 1)
    assert [m["content"] for m in session.messages[2:]] == ["Who keeps it?", reply.text]
    assert cache_matches_window(small_engine, session)
    history.close()


@pytest.mark.model
def test_a_stopped_regeneration_is_kept_interrupted_and_continues(
    small_engine: Engine, tmp_path: Path
) -> None:
    session, history = chat_with_two_turns(small_engine, tmp_path)
    cancel = threading.Event()
    texts = []
    for event in session.regenerate(
        options=GenerationOptions(max_tokens=40, sampling=GREEDY, cancel=cancel)
    ):
        if isinstance(event, TokenEvent) and event.text:
            texts.append(event.text)
            if len(texts) == 3:
                cancel.set()
    stored = history.messages(sid(session))[-1]
    assert stored.status == "interrupted" and stored.versions == 2
    assert stored.content == "".join(texts)
    reply = reply_of(session.continue_reply(GenerationOptions(max_tokens=6, sampling=GREEDY)))
    again = history.messages(sid(session))[-1]
    assert again.id == stored.id and again.content == reply.text
    assert reply.text.startswith(stored.content) and len(reply.text) > len(stored.content)
    history.close()


@pytest.mark.model
def test_an_edit_too_long_for_the_window_changes_nothing(
    small_engine: Engine, tmp_path: Path
) -> None:
    session, history = chat_with_two_turns(small_engine, tmp_path)
    before = [dict(m) for m in session.messages]
    stored = history.all_messages(sid(session))
    with pytest.raises(ContextOverflow, match="shorten it"):
        reply_of(session.edit(2, "lighthouse " * 2000, GenerationOptions(max_tokens=8)))
    assert session.messages == before
    assert history.all_messages(sid(session)) == stored
    reply_of(session.send("Still there?", GenerationOptions(max_tokens=4, sampling=GREEDY)))
    assert history.messages(sid(session))[-2].content == "Still there?"
    history.close()


# --- refusals (fake engine, no model) -----------------------------------------------------------


def fake_session(tmp_path: Path, *, stored: bool = True) -> ChatSession:
    engine = FakeEngine(lambda prompt: f"echo {prompt}", delay=0)
    history = History(tmp_path / "h.sqlite3") if stored else None
    return ChatSession(engine, PromptBuilder(engine), history=history)


def test_version_requests_on_the_wrong_message_say_what_to_pick(tmp_path: Path) -> None:
    session = fake_session(tmp_path)
    with pytest.raises(UsageError, match="not a reply"):
        list(session.regenerate())
    reply_of(session.send("hi"))
    with pytest.raises(UsageError, match="not a message of yours"):
        list(session.edit(1, "x"))
    with pytest.raises(UsageError, match="not a reply"):
        list(session.regenerate(0))
    assert session.versions(1)[0].content == "echo hi"


def test_without_a_history_edits_work_but_there_are_no_versions_to_switch(tmp_path: Path) -> None:
    session = fake_session(tmp_path, stored=False)
    reply_of(session.send("one"))
    reply = reply_of(session.edit(0, "two"))
    assert reply.text == "echo two" and [m["content"] for m in session.messages] == [
        "two",
        "echo two",
    ]
    with pytest.raises(UsageError, match="not saved"):
        session.switch_version(0, -1)


def test_regenerating_a_reply_whose_turn_left_the_window_brings_it_back(tmp_path: Path) -> None:
    engine = FakeEngine(
        lambda prompt: f"echo {prompt} " + "and more words " * 6, n_ctx=160, delay=0
    )
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(engine, PromptBuilder(engine), history=history, reply_reserve=40)
    for i in range(6):
        reply_of(session.send(f"question {i}"))
    assert session.window_start > 1  # the first turn left the window
    reply = reply_of(session.regenerate(1))
    assert reply.text.startswith("echo question 0")
    assert [m["content"] for m in session.messages] == ["question 0", reply.text]
    stored = history.messages(sid(session))
    assert (stored[-1].version, stored[-1].versions) == (2, 2)
    history.close()
