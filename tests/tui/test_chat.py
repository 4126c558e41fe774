"""The chat screen driven like a user would, on the fake engine (fast: no model)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import pytest

from localfab.tui.local_backend import ChatOptions
from localfab.tui.widgets.dialogs import ErrorDialog
from localfab.tui.widgets.messages import ShiftDivider
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.sessions import SessionItem, SessionsPanel
from tests.fake_engine import SAMPLE_REPLY, FakeEngine
from tests.tui_support import build_app, finished, loaded, replies, send, wait_for

pytestmark = pytest.mark.anyio


def label_text(app, selector: str) -> str:
    return str(app.chat.query_one(selector).render())


async def test_a_reply_streams_as_markdown_and_the_status_bar_shows_speed(history):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        assert "fake-model" in label_text(app, "#status-model")
        assert "GPU 0/18" in label_text(app, "#status-gpu")
        await send(pilot, app, "hello there")
        await finished(pilot, app)
        reply = replies(app)[-1]
        assert reply.text == SAMPLE_REPLY
        assert reply.markdown.source == SAMPLE_REPLY
        # The code block and the table became Markdown blocks, not plain text.
        kinds = {type(b).__name__ for b in reply.markdown.children}
        assert {"MarkdownFence", "ReplyTable"} <= kinds
        assert chat.last_finish == "stop"
        assert "tok/s" in label_text(app, "#status-speed")
        assert "—" not in label_text(app, "#status-speed")
        assert label_text(app, "#status-ctx").startswith("ctx ")
        assert "— J/tok" in label_text(app, "#status-energy")
        footer = str(reply.query_one(".reply-footer").render())
        assert "tokens" in footer and "tok/s" in footer and "TTFT" in footer


async def test_escape_stops_a_reply_and_keeps_its_text(history):
    app, engine = build_app(history, engine=FakeEngine(hold_after=12))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: len(replies(app)[-1].text) > 0 and chat.streaming)
        await wait_for(pilot, lambda: replies(app)[-1].markdown.source.count(" ") >= 5)
        await pilot.press("escape")
        await finished(pilot, app)
        reply = replies(app)[-1]
        assert chat.last_finish == "cancelled"
        assert reply.text and SAMPLE_REPLY.startswith(reply.text)
        assert reply.text != SAMPLE_REPLY
        assert "stopped" in str(reply.query_one(".reply-footer").render())
        stored = history.messages(app.backend.session_id)
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[-1].status == "interrupted"
        assert stored[-1].content == reply.text


async def test_a_reply_cut_at_the_token_limit_continues_without_a_seam(history):
    options = ChatOptions(max_tokens=15, max_continues=0)
    app, _ = build_app(history, options=options)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        reply = replies(app)[-1]
        assert chat.last_finish == "length"
        cut_text = reply.text
        assert SAMPLE_REPLY.startswith(cut_text) and cut_text != SAMPLE_REPLY
        assert "cut at the token limit" in str(reply.query_one(".reply-footer").render())
        for _ in range(20):
            if chat.last_finish == "stop":
                break
            done = chat.replies_finished
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda done=done: chat.replies_finished > done)
        assert chat.last_finish == "stop"
        assert len(replies(app)) == 1
        assert reply.text == SAMPLE_REPLY
        assert reply.markdown.source == SAMPLE_REPLY


async def test_auto_continue_joins_the_pieces_and_says_so(history):
    app, _ = build_app(history, options=ChatOptions(max_tokens=20, max_continues=10))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        reply = replies(app)[-1]
        assert chat.last_finish == "stop"
        assert reply.text == SAMPLE_REPLY
        assert "continued" in str(reply.query_one(".reply-footer").render())


async def test_a_shift_divider_appears_when_old_turns_leave_the_window(history):
    engine = FakeEngine(reply=lambda prompt: "A short reply of a few words.", n_ctx=96)
    app, _ = build_app(history, engine=engine, options=ChatOptions(reply_reserve=24))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        for i in range(8):
            await send(pilot, app, f"message number {i} with some words")
            await finished(pilot, app)
            if chat.query(ShiftDivider):
                break
        dividers = list(chat.query(ShiftDivider))
        assert dividers, "no divider after eight turns in a 96-token window"
        text = str(dividers[0].render())
        assert dividers[0].turns >= 1 and dividers[0].tokens > 0
        assert f"({dividers[0].tokens} tokens) left the window" in text
        assert "the system prompt stayed" in text
        # Nothing was lost on screen: every turn is still shown.
        assert len(replies(app)) == i + 1


async def test_a_chat_is_saved_as_it_streams_and_resumes(history):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "first question")
        await finished(pilot, app)
        session_id = app.backend.session_id
    stored = history.session(session_id)
    assert stored is not None and stored.title == "first question"
    assert [m.content for m in history.messages(session_id)] == ["first question", SAMPLE_REPLY]

    # A new app on the same database, resumed from the sessions panel.
    app2, _ = build_app(history)
    async with app2.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app2)
        panel = chat.query_one(SessionsPanel)
        assert panel.display
        # The list is rebuilt in a queued step: wait for it rather than for a fixed time.
        await wait_for(pilot, lambda: len(panel.query(SessionItem)) == 1)
        items = list(panel.query(SessionItem))
        assert [i.session.title for i in items] == ["first question"]
        panel.query_one("#sessions-list").focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(replies(app2)) == 1)
        assert replies(app2)[0].text == SAMPLE_REPLY
        assert app2.backend.session_id == session_id
        # The prompt history holds the resumed chat's prompts.
        chat.query_one(PromptBox).focus()
        await pilot.press("up")
        await wait_for(pilot, lambda: chat.query_one(PromptBox).text == "first question")
        # And the chat goes on in the same stored session.
        await send(pilot, app2, "second")
        await finished(pilot, app2)
    assert [m.role for m in history.messages(session_id)] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]


async def test_sessions_rename_and_delete_with_undo(history):
    for title in ("alpha", "beta"):
        sid = history.create_session(model="fake-model")
        history.add_message(sid, "user", title)
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app)
        panel = chat.query_one(SessionsPanel)
        await wait_for(pilot, lambda: len(panel.query(SessionItem)) == 2)
        panel.query_one("#sessions-list").focus()
        await pilot.press("r")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "TextDialog")
        await pilot.press("ctrl+a", "ctrl+k", *"renamed", "enter")
        await wait_for(pilot, lambda: any(s.title == "renamed" for s in history.sessions()))
        titles = sorted(s.title or "" for s in history.sessions())
        assert titles in (["alpha", "renamed"], ["beta", "renamed"])
        before = len(history.sessions())
        panel.query_one("#sessions-list").focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: len(history.sessions()) == before - 1)
        await pilot.press("ctrl+z")
        await wait_for(pilot, lambda: len(history.sessions()) == before)
        assert sorted(s.title or "" for s in history.sessions()) == titles


async def test_prompt_box_newline_and_earlier_prompts(history):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        box = chat.query_one(PromptBox)
        box.focus()
        await pilot.press("a", "ctrl+j", "b")
        assert box.text == "a\nb"
        await pilot.press("enter")
        await finished(pilot, app)
        assert box.text == ""
        await send(pilot, app, "second")
        await finished(pilot, app)
        await pilot.press("up")
        assert box.text == "second"
        await pilot.press("up")
        assert box.text == "a\nb"
        await pilot.press("down", "down")
        assert box.text == ""


async def test_theme_switch_applies_to_the_screen(history):
    app, _ = build_app(history, theme="localfab-dark")
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "localfab-dark"
        dark_bg = app.screen.styles.background
        assert app.theme in app.localfab_themes and len(app.localfab_themes) >= 3
        while app.theme != "localfab-light":
            await pilot.press("ctrl+t")
            await pilot.pause()
        assert app.current_theme.dark is False
        assert app.screen.styles.background != dark_bg
        assert app.screen.styles.background.hex.upper() == "#FAFAF7"


async def test_a_model_that_fails_to_load_shows_why_and_the_app_stays_usable(history):
    reason = "gemma.gguf is truncated (120 of 241 MB): download it again with localfab pull"
    app, _ = build_app(history, fail=reason)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot, lambda: isinstance(app.screen, ErrorDialog) and app.screen.query(".dialog-body")
        )
        assert reason in str(app.screen.query_one(".dialog-body").render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ErrorDialog))
        chat = app.chat
        assert not chat.loaded
        assert "not loaded" in label_text(app, "#status-model")
        await pilot.press("h", "i", "enter")
        assert not chat.streaming and not replies(app)
        await pilot.press("ctrl+s")
        assert not chat.query_one(SessionsPanel).display


async def test_a_load_can_be_cancelled(history):
    app, _ = build_app(history, steps=500, step_delay=0.01)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.model_loading)
        assert app.chat.query_one("#load-panel").display
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.chat.model_loading)
        assert not app.chat.loaded
        assert not isinstance(app.screen, ErrorDialog)
        assert not app.chat.query_one("#load-panel").display


async def test_full_collections_are_kept_short_while_a_model_loads(history):
    # The objects the app held when the load began are out of the collector's full passes
    # (each a 30-60 ms stall of the event loop here) until the model is loaded.
    app, _ = build_app(history, steps=20, step_delay=0.02)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.model_loading)
        assert gc.get_freeze_count() > 0
        await loaded(pilot, app)
        await wait_for(pilot, lambda: gc.get_freeze_count() == 0)
    # And a load that fails (or is cancelled) gives them back too.
    app, _ = build_app(history, fail="truncated", steps=20, step_delay=0.02)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.model_loading)
        assert gc.get_freeze_count() > 0
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog))
        assert gc.get_freeze_count() == 0


async def test_the_prompt_cursor_holds_still_while_a_reply_streams(history):
    # Each blink is a repaint; on shared cores the UI's CPU comes out of decoding.
    engine = FakeEngine(hold_after=8)
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        box = chat.query_one(PromptBox)
        assert box.cursor_blink
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: chat.streaming and len(replies(app)[-1].text) > 0)
        assert not box.cursor_blink
        engine.release.set()
        await finished(pilot, app)
        assert box.cursor_blink


async def test_quitting_during_a_reply_saves_it_marked_interrupted(history):
    app, engine = build_app(history, engine=FakeEngine(hold_after=8))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: chat.streaming and len(replies(app)[-1].text) > 0)
        session_id = app.backend.session_id
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: app._exit_renderables is not None or not app.is_running)
    stored = history.messages(session_id)
    assert stored[-1].role == "assistant"
    assert stored[-1].status == "interrupted"
    assert stored[-1].content and SAMPLE_REPLY.startswith(stored[-1].content)
    # The collector gets back what the streaming reply kept out of its full passes.
    assert gc.get_freeze_count() == 0
    assert not any("_after_pass" in getattr(cb, "__name__", "") for cb in gc.callbacks)


async def test_ctrl_c_stops_a_reply_and_does_not_quit(history):
    app, _ = build_app(history, engine=FakeEngine(hold_after=8))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: chat.streaming and len(replies(app)[-1].text) > 0)
        await pilot.press("ctrl+c")
        await finished(pilot, app)
        assert chat.last_finish == "cancelled"
        assert app.is_running


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")
def test_the_app_paints_without_importing_llama_cpp(tmp_path):
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from localfab.chat.history import History\n"
        "from localfab.tui.app import AppDeps, make_app\n"
        "async def main():\n"
        f"    history = History(Path({str(tmp_path)!r}) / 's.db')\n"
        "    app = make_app(AppDeps(history=history))\n"
        "    async with app.run_test(size=(80, 24)) as pilot:\n"
        "        await pilot.pause()\n"
        "        assert 'No model is loaded' in str(app.screen.query_one('#welcome').render())\n"
        "    print('llama_cpp' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


async def test_a_damaged_history_is_left_alone_and_the_app_says_chats_are_not_saved(tmp_path):
    from localfab.commands.chat import open_history
    from localfab.tui.app import AppDeps, make_app

    damaged = tmp_path / "sessions.sqlite3"
    damaged.write_bytes(b"not a database " * 100)
    history, problem = open_history(damaged)
    assert problem is not None and str(damaged) in problem and "not be saved" in problem
    app = make_app(AppDeps(backend=None, history=history, notices=(problem,)))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: any("not be saved" in n.message for n in app._notifications))
    assert damaged.read_bytes() == b"not a database " * 100


def weights_loader(total: int, gate: threading.Event, seen: list[float]):
    """A loader whose weights report per-tensor progress the way the engine does (through
    `weights_progress`), holding at half-way until `gate` is set."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.errors import LoadCancelled
    from localfab.tui.backend import LoadProgress, ModelCard
    from localfab.tui.local_backend import ChatModel
    from localfab.tui.model_loader import WEIGHTS_START, weights_progress

    def load(progress, cancel):
        progress(LoadProgress("loading weights", WEIGHTS_START, "plan"))
        on_weights = weights_progress(progress, cancel, "plan")
        for i in range(total + 1):
            if i == total // 2:
                gate.wait(20)
            if not on_weights(i / total):
                raise LoadCancelled("the model load was cancelled")
            seen.append(i / total)
        eng = FakeEngine()
        info = ModelCard("fake-model", "/m.gguf", eng.n_ctx, 0, 18)
        return ChatModel(eng, PromptBuilder(eng), info, eng.close)

    return load


async def test_the_load_bar_shows_the_weights_fraction_and_cancel_stops_them(history):
    from textual.widgets import ProgressBar

    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.local_backend import LocalBackend

    gate = threading.Event()
    seen: list[float] = []
    backend = LocalBackend(weights_loader(400, gate, seen), history, "fake-model")
    app = make_app(AppDeps(backend=backend, history=history, model_name="fake-model"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(seen) >= 200)
        bar = app.chat.query_one("#load-bar", ProgressBar)
        await wait_for(pilot, lambda: bar.progress >= 45)
        assert bar.total == 100 and bar.progress < 60  # a real fraction, not a spinner
        await pilot.press("ctrl+l")
        gate.set()
        await wait_for(pilot, lambda: not app.chat.model_loading)
        assert not app.chat.loaded
        assert len(seen) < 400  # the weights stopped mid-way
        assert not isinstance(app.screen, ErrorDialog)


async def test_the_final_speed_stays_when_the_end_comes_before_the_generator_returns(history):
    # The reply's end wakes the screen at once; the generator itself may return later, and the
    # live figure must not replace the final one meanwhile (the screen goes on ticking).
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        backend = app.backend
        send_reply = backend.send
        returns = threading.Event()  # held until the test has looked, however slow

        def late_end(text, *, cancel, images=()):
            yield from send_reply(text, cancel=cancel, images=images)
            returns.wait(10)

        backend.send = late_end
        ticks = []
        ticked = chat._ticked

        def counted() -> None:
            ticks.append(1)
            ticked()

        chat._ticked = counted
        await send(pilot, app, "hello there")
        await wait_for(pilot, lambda: chat.last_finish == "stop")
        seen = len(ticks)
        await wait_for(pilot, lambda: len(ticks) >= seen + 2)  # two ticks after the end
        assert chat.streaming  # the generator has not returned yet
        speed = label_text(app, "#status-speed")
        returns.set()
        await finished(pilot, app)
    assert "tok/s" in speed and "—" not in speed
