"""Message versions in the chat app, driven like a user would, on the fake engine.

Regenerate (alt+r, `r` on a focused reply, the command palette), edit (`e` on a focused prompt),
switch versions (←/→ on a focused message), with streaming, stop, continue and quitting.
"""

from __future__ import annotations

import itertools

import pytest
from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.tui.app import LocalfabApp
from localfab.tui.screens.search import SearchScreen
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.versions import ChatMessage, version_text
from tests.fake_engine import SAMPLE_REPLY, FakeEngine
from tests.tui_support import build_app, finished, loaded, palette_shows, send, wait_for

pytestmark = pytest.mark.anyio


def numbered_engine(**kwargs: object) -> FakeEngine:
    """Each reply names its number, so that versions differ."""
    counter = itertools.count(1)
    return FakeEngine(lambda prompt: f"reply {next(counter)} to {prompt}", **kwargs)  # type: ignore[arg-type]


def views(app: LocalfabApp) -> list[ChatMessage]:
    return list(app.chat.query(ChatMessage))


def replies(app: LocalfabApp) -> list[ChatMessage]:
    return [v for v in views(app) if v.role == "assistant"]


def session_id(app: LocalfabApp) -> int:
    backend = app.chat.backend
    assert backend is not None and backend.session_id is not None
    return backend.session_id


def role_line(view: ChatMessage) -> str:
    return str(view.query_one(".role").render())


async def regenerate(pilot: Pilot[None], app: LocalfabApp, *keys: str) -> None:
    chat = app.chat
    done = chat.replies_finished
    await pilot.press(*keys)
    await wait_for(pilot, lambda: chat.replies_finished > done and not chat.streaming)
    await pilot.pause()


async def test_regenerate_makes_a_new_version_and_arrows_switch_back(history: History) -> None:
    app, _ = build_app(history, engine=numbered_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hello")
        await finished(pilot, app)
        first = replies(app)[-1]
        assert first.text == "reply 1 to hello" and first.indicator == ""
        await regenerate(pilot, app, "alt+r")
        reply = replies(app)[-1]
        assert reply is not first and reply.text == "reply 2 to hello"
        assert len(views(app)) == 2  # the old reply left the screen, not the history
        assert reply.indicator == "‹ 2/2 ›" and "‹ 2/2 ›" in role_line(reply)
        sid = session_id(app)
        assert [m.content for m in history.messages(sid)] == ["hello", "reply 2 to hello"]
        assert reply.message_id is not None
        assert [m.content for m in history.siblings(reply.message_id)] == [
            "reply 1 to hello",
            "reply 2 to hello",
        ]
        # Focus the reply and go to the older version, then back.
        await pilot.press("alt+up")
        assert chat.focused is reply
        await pilot.press("left")
        await wait_for(
            pilot, lambda: bool(replies(app)) and replies(app)[-1].text == "reply 1 to hello"
        )
        await pilot.pause()
        older = replies(app)[-1]
        assert older.indicator == "‹ 1/2 ›" and chat.focused is older
        assert history.messages(sid)[-1].content == "reply 1 to hello"
        await pilot.press("left")  # already the oldest: says so, changes nothing
        await pilot.pause()
        assert replies(app)[-1] is older
        await pilot.press("right")
        await wait_for(pilot, lambda: replies(app)[-1].text == "reply 2 to hello")
        assert replies(app)[-1].indicator == "‹ 2/2 ›"
        # `r` on the focused reply makes a third version.
        replies(app)[-1].focus()
        await regenerate(pilot, app, "r")
        assert replies(app)[-1].text == "reply 3 to hello"
        assert replies(app)[-1].indicator == "‹ 3/3 ›"


async def test_edit_a_prompt_into_a_new_version_and_back(history: History) -> None:
    app, _ = build_app(history, engine=numbered_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        for text in ("first", "second"):
            await send(pilot, app, text)
            await finished(pilot, app)
        await pilot.press("alt+up", "up")  # the last reply, then the prompt before it
        target = views(app)[2]
        assert chat.focused is target and target.text == "second"
        await pilot.press("e")
        box = chat.query_one(PromptBox)
        assert box.text == "second" and box.has_focus and "Editing" in str(box.border_title)
        await pilot.press(*["backspace"] * 6, *"changed")
        done = chat.replies_finished
        await pilot.press("enter")
        await wait_for(pilot, lambda: chat.replies_finished > done and not chat.streaming)
        await pilot.pause()
        assert [v.text for v in views(app)] == [
            "first",
            "reply 1 to first",
            "changed",
            "reply 3 to changed",
        ]
        edited = views(app)[2]
        assert edited.indicator == "‹ 2/2 ›" and box.text == "" and box.border_title is None
        sid = session_id(app)
        assert len(history.all_messages(sid)) == 6
        # ← on the edited prompt brings back the old prompt and its reply.
        edited.focus()
        await pilot.press("left")
        await wait_for(pilot, lambda: views(app)[2].text == "second")
        assert [v.text for v in views(app)[2:]] == ["second", "reply 2 to second"]
        assert views(app)[2].indicator == "‹ 1/2 ›"


async def test_escape_cancels_an_edit_and_keeps_the_chat(history: History) -> None:
    app, _ = build_app(history, engine=numbered_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "only")
        await finished(pilot, app)
        await pilot.press("alt+e")
        box = chat.query_one(PromptBox)
        assert box.text == "only" and box.border_title
        await pilot.press("escape")
        assert box.text == "" and not box.border_title
        await pilot.press(*"next", "enter")
        await wait_for(pilot, lambda: chat.replies_finished == 2 and not chat.streaming)
        assert [v.text for v in views(app)][-2:] == ["next", "reply 2 to next"]
        assert len(history.all_messages(session_id(app))) == 4


async def test_a_stopped_regeneration_continues_and_stays_one_version(history: History) -> None:
    engine = FakeEngine(hold_after=6)
    engine.release.set()
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        engine.release.clear()
        await pilot.press("alt+r")
        await wait_for(pilot, lambda: chat.streaming and len(replies(app)[-1].text) > 0)
        await pilot.press("escape")
        await finished(pilot, app)
        assert chat.last_finish == "cancelled"
        sid = session_id(app)
        stopped = history.messages(sid)[-1]
        assert stopped.status == "interrupted" and stopped.versions == 2
        assert replies(app)[-1].indicator == "‹ 2/2 ›"
        engine.release.set()
        done = chat.replies_finished
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: chat.replies_finished > done and not chat.streaming)
        stored = history.messages(sid)[-1]
        assert stored.id == stopped.id and stored.status == "complete"
        assert stored.content == SAMPLE_REPLY == replies(app)[-1].text
        assert stored.versions == 2


async def test_quitting_mid_regeneration_keeps_the_partial_version_interrupted(
    history: History,
) -> None:
    engine = FakeEngine(hold_after=6)
    engine.release.set()
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        engine.release.clear()
        sid = session_id(app)
        await pilot.press("alt+r")
        await wait_for(pilot, lambda: chat.streaming and len(replies(app)[-1].text) > 0)
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app._exit_renderables is not None or not app.is_running)
    stored = history.messages(sid)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[-1].status == "interrupted" and (stored[-1].version, stored[-1].versions) == (
        2,
        2,
    )
    assert stored[-1].content and SAMPLE_REPLY.startswith(stored[-1].content)
    assert history.siblings(stored[-1].id)[0].content == SAMPLE_REPLY


async def test_versions_are_in_the_command_palette(history: History) -> None:
    app, _ = build_app(history, engine=numbered_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "palette")
        await finished(pilot, app)
        await pilot.press("ctrl+p")
        await pilot.press(*"Regenerate reply")
        await wait_for(pilot, lambda: palette_shows(app, "Regenerate reply"))
        done = chat.replies_finished
        await pilot.press("enter")
        await wait_for(pilot, lambda: chat.replies_finished > done and not chat.streaming)
        await pilot.pause()
        assert replies(app)[-1].text == "reply 2 to palette"
        assert replies(app)[-1].indicator == "‹ 2/2 ›"


async def test_switching_is_refused_while_a_reply_streams(history: History) -> None:
    engine = FakeEngine(hold_after=4)
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: chat.streaming)
        await pilot.press("alt+r")
        await pilot.pause()
        assert len(replies(app)) == 1 and chat.streaming
        engine.release.set()
        await finished(pilot, app)
        assert len(history.all_messages(session_id(app))) == 2


async def test_a_search_hit_in_an_older_version_opens_that_version(history: History) -> None:
    sid = history.create_session(model="fake-model")
    question = history.add_message(sid, "user", "tell me about birds")
    old = history.add_message(sid, "assistant", "the axolotl is not a bird")
    history.add_message(sid, "assistant", "birds fly", sibling_of=old)
    other = history.create_session(model="fake-model")
    history.add_message(other, "user", "something else")
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        search = app.screen
        assert isinstance(search, SearchScreen)
        await pilot.press(*"axolotl")
        await wait_for(pilot, lambda: len(search.hits) == 1)
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(chat.query(".search-hit")))
        (hit,) = chat.query(".search-hit")
        assert isinstance(hit, ChatMessage) and hit.message_id == old
        assert hit.indicator == version_text(1, 2)
        assert [m.id for m in history.messages(sid)] == [question, old]


def test_version_text() -> None:
    assert version_text(1, 1) == "" and version_text(2, 3) == "‹ 2/3 ›"


async def test_regenerating_an_older_reply_branches_there(history: History) -> None:
    app, _ = build_app(history, engine=numbered_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        for text in ("one", "two"):
            await send(pilot, app, text)
            await finished(pilot, app)
        views(app)[1].focus()
        await regenerate(pilot, app, "r")
        assert [v.text for v in views(app)] == ["one", "reply 3 to one"]
        assert views(app)[1].indicator == "‹ 2/2 ›"
        views(app)[1].focus()
        await pilot.press("left")
        await wait_for(pilot, lambda: len(views(app)) == 4)
        assert [v.text for v in views(app)] == ["one", "reply 1 to one", "two", "reply 2 to two"]
        assert chat.focused is views(app)[1]
