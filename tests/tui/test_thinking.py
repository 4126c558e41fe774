"""A thinking model in the chat app, on the fake engine with Qwen3's real chat template: the thought
streams above the answer, folds when the answer begins, unfolds with F3 (alt+t) or a click, is
stored apart and comes back folded; the chat's thinking goes off (enable_thinking false) and
gets a budget from the command palette; copy copies the answer only."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.tui.widgets.status import StatusBar
from localfab.tui.widgets.thought import ThoughtBlock, tail_of, thought_header
from tests.fake_engine import FakeEngine
from tests.tui_support import build_app, finished, loaded, palette_shows, replies, send, wait_for

pytestmark = pytest.mark.anyio

QWEN3 = (Path(__file__).parents[1] / "engine" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
THOUGHT = "The user asks for the answer.\nIt is six times seven.\nThat makes 42."
ANSWER = "The answer is **42**."
REPLY = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


def thinking_engine(**kw: object) -> FakeEngine:
    return FakeEngine(reply=lambda prompt: REPLY, template=QWEN3, **kw)  # type: ignore[arg-type]


def shown(block: ThoughtBlock) -> str:
    return str(block.render())


def test_the_header_says_how_long_and_how_many_tokens() -> None:
    assert thought_header(3.25, 120, open_=False, live=False) == "▸ Thought for 3.2 s · 120 tokens"
    assert thought_header(0.42, None, open_=True, live=False) == "▾ Thought for 420 ms"
    assert thought_header(1.0, 5, open_=False, live=True) == "▸ Thinking… 1.0 s"
    assert tail_of("a\nb\nc\nd\ne\n", 2) == "d\ne"


async def test_the_thought_streams_folds_when_the_answer_begins_and_unfolds(history):
    engine = thinking_engine(hold_after=8)
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "What is six times seven?")
        # Mid-thought: the block is live, showing the thought so far; no answer yet.
        await wait_for(pilot, lambda: replies(app) and replies(app)[-1].thought is not None)
        block = replies(app)[-1].thought
        assert block is not None
        await wait_for(pilot, lambda: "user asks" in shown(block))
        assert block.live and "Thinking…" in shown(block) and replies(app)[-1].text == ""
        engine.release.set()
        await finished(pilot, app)
        reply = replies(app)[-1]
        # The answer began: the block folded to one line with its figures.
        assert not block.live and not block.open
        header = shown(block)
        assert header.startswith("▸ Thought for ") and "tokens" in header
        assert "makes 42" not in header
        assert reply.text == ANSWER and "42" in reply.markdown.source
        # The status bar says how long it thought, apart from the TTFT.
        assert "thought " in str(chat.query_one("#status-thought").render())
        assert chat.query_one(StatusBar).query_one("#status-thought").display
        # F3 unfolds the last reply's thought, a click folds it again.
        await pilot.press("f3")
        await pilot.pause()
        assert block.open and "It is six times seven." in shown(block)
        await pilot.click(block)
        await pilot.pause()
        assert not block.open
        # Copy takes the answer, never the thought.
        assert chat.query_one("ChatLog").last_reply_text() == ANSWER  # type: ignore[attr-defined]
    stored = history.messages(app.backend.session_id)[-1]
    assert (stored.content, stored.reasoning) == (ANSWER, THOUGHT + "\n")


async def test_a_reopened_chat_shows_its_thoughts_folded(history):
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "Why?")
    reply = history.add_message(sid, "assistant", "Because.")
    history.update_message(reply, "Because.", reasoning="Let me see.\nIt is so.")
    app, _ = build_app(history, engine=thinking_engine(), session_id=sid)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await wait_for(pilot, lambda: len(replies(app)) == 1)
        block = replies(app)[0].thought
        assert block is not None and shown(block) == "▸ Thought"
        block.focus()
        await pilot.press("enter")
        assert "It is so." in shown(block)


async def command(pilot, app, name: str) -> None:
    """Run the palette's command `name`, typed as a user would."""
    chat = app.chat
    await pilot.press("ctrl+p")
    await pilot.press(*name)
    await wait_for(pilot, lambda: palette_shows(app, name))
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.screen is chat)


async def test_thinking_off_and_a_budget_from_the_palette(history):
    engine = thinking_engine()
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "first")
        await finished(pilot, app)
        assert engine.last_prompt.endswith("<|im_start|>assistant\n")  # the template's default
        await command(pilot, app, "Thinking on/off")
        await send(pilot, app, "second")
        await finished(pilot, app)
        # Off: the template's enable_thinking is false, so the prompt closes the block itself.
        assert engine.last_prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        await command(pilot, app, "Thinking budget: 1,024 tokens")
        await send(pilot, app, "third")
        await finished(pilot, app)
        assert engine.last_options is not None and engine.last_options.reasoning_budget == 1024
        # A new chat starts from the defaults again.
        await pilot.press("ctrl+n")
        await pilot.pause()
        await send(pilot, app, "fourth")
        await finished(pilot, app)
        assert engine.last_prompt.endswith("<|im_start|>assistant\n")
        assert engine.last_options.reasoning_budget == -1


async def test_a_model_that_does_not_think_says_so(history):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        chat.action_toggle_thinking()
        await pilot.pause()
        assert any("does not think" in str(n.message) for n in app._notifications)
        await send(pilot, app, "hello")
        await finished(pilot, app)
        assert replies(app)[-1].thought is None
        assert not chat.query_one("#status-thought").display


async def test_search_leaves_thoughts_out_unless_asked(history):
    from localfab.tui.screens.search import SearchScreen

    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "Is 2027 prime?")
    reply = history.add_message(sid, "assistant", "Yes.")
    history.update_message(reply, "Yes.", reasoning="no divisor up to 45")
    app, _ = build_app(history, engine=thinking_engine())
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        chat.action_search()
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        screen = app.screen
        assert isinstance(screen, SearchScreen)
        screen.debounce_s = 0.01
        await pilot.press(*"divisor")
        await wait_for(pilot, lambda: screen.searches >= 1 and screen.hits == [])
        await pilot.press("alt+t")
        await wait_for(pilot, lambda: len(screen.hits) == 1)
        assert screen.hits[0].role == "thought" and screen.hits[0].message_id == reply
