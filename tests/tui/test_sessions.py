"""The sessions features of the app, driven like a user would on the fake engine: full-text
search that opens the hit, export and import, and resuming a long chat."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from textual.containers import VerticalScroll
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Input

from localfab.chat.history import History
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.backend import ReportsWindow, StoredTurn
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.screens.chat_parts import shown_index
from localfab.tui.screens.search import SearchScreen
from localfab.tui.widgets.dialogs import TextDialog
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.sessions import AHEAD, PAGE, ResumeDivider, SessionItem, SessionsPanel
from tests.fake_engine import FakeEngine, fake_loader
from tests.tui_support import FIXED_NOW, build_app, loaded, wait_for

pytestmark = pytest.mark.anyio


def long_chat(history: History, turns: int, *, needle: str | None = None, at: int = 1) -> int:
    """A stored chat of `turns` exchanges; turn `at`'s reply holds `needle`."""
    sid = history.create_session(model="fake-model")
    for i in range(turns):
        history.add_message(sid, "user", f"question {i} about the weather and the sea")
        reply = f"answer {i}: waves, wind and some clouds over the water."
        if needle and i == at:
            reply = f"answer {i}: the {needle} lives near the shore."
        history.add_message(sid, "assistant", reply)
    return sid


def search_screen(app: LocalfabApp) -> SearchScreen:
    screen = app.screen
    assert isinstance(screen, SearchScreen)
    return screen


def session_of(app: LocalfabApp) -> int | None:
    """The chat the app's backend has open."""
    assert app.backend is not None
    return app.backend.session_id


def visible(log: VerticalScroll, view: MessageView) -> bool:
    top = view.virtual_region.y
    return log.scroll_offset.y <= top < log.scroll_offset.y + log.scrollable_content_region.height


async def test_search_opens_the_hit_highlighted_and_in_view(history: History) -> None:
    long_chat(history, 6)
    target = long_chat(history, 12, needle="axolotl", at=1)
    long_chat(history, 4)
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        search = search_screen(app)
        assert isinstance(search, SearchScreen)
        await pilot.press(*"axolo")  # a prefix is enough
        await wait_for(pilot, lambda: len(search.hits) == 1)
        assert search.hits[0].session_id == target
        assert "1 messages" in str(search.query_one("#search-status").render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(chat.query(".search-hit")))
        await pilot.pause()
        assert session_of(app) == target
        (hit,) = chat.query(".search-hit")
        assert isinstance(hit, MessageView) and "axolotl" in hit.text
        log = chat.query_one("#chat-log", VerticalScroll)
        await wait_for(pilot, lambda: visible(log, hit))
        # The chat is long: the view is not at its end, where it would open without a hit.
        assert log.scroll_offset.y < log.max_scroll_y
        last = [v for v in chat.query(MessageView)][-1]
        assert not visible(log, last)


async def test_search_says_when_nothing_is_found_and_escape_closes(history: History) -> None:
    long_chat(history, 2)
    app, _ = build_app(history)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await loaded(pilot, app)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        search = search_screen(app)
        await pilot.press(*"zebra")
        await wait_for(
            pilot, lambda: search.searches > 0 and search.query_one(Input).value == "zebra"
        )
        await wait_for(
            pilot, lambda: "Nothing found" in str(search.query_one("#search-status").render())
        )
        assert search.hits == []
        await pilot.press("enter")  # nothing to open: the search stays
        assert app.screen is search
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is chat)
        assert not chat.query(".search-hit")


async def answer_dialog(pilot: Pilot[None], app: LocalfabApp, text: str) -> None:
    await wait_for(
        pilot, lambda: isinstance(app.screen, TextDialog) and bool(app.screen.query(Input))
    )
    app.screen.query_one(Input).value = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, TextDialog))


async def test_export_markdown_and_json_then_import_from_the_panel(
    history: History, tmp_path: Path
) -> None:
    sid = long_chat(history, 3)
    history.rename_session(sid, "Weather talk")
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app)
        panel = chat.query_one(SessionsPanel)
        await wait_for(pilot, lambda: len(panel.query(SessionItem)) == 1)
        panel.query_one("#sessions-list").focus()
        await pilot.press("e")
        await answer_dialog(pilot, app, str(tmp_path / "out" / "chat.md"))
        md = (tmp_path / "out" / "chat.md").read_text(encoding="utf-8")
        assert md.startswith("# Weather talk") and "answer 2: waves" in md

        panel.query_one("#sessions-list").focus()
        await pilot.press("e")
        await answer_dialog(pilot, app, str(tmp_path / "chat.json"))
        data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
        assert len(data["messages"]) == 6

        panel.query_one("#sessions-list").focus()
        await pilot.press("i")
        await answer_dialog(pilot, app, str(tmp_path / "chat.json"))
        await wait_for(pilot, lambda: len(history.sessions()) == 2)
        new = next(s.id for s in history.sessions() if s.id != sid)
        assert [(m.role, m.content) for m in history.messages(new)] == [
            (m.role, m.content) for m in history.messages(sid)
        ]
        # The imported chat is listed and picked in the panel.
        await wait_for(pilot, lambda: panel.selected_id() == new)


async def test_import_of_a_bad_file_says_why_and_stores_nothing(
    history: History, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}', encoding="utf-8")
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot, app)
        await app.run_action("screen.import_chat")
        await answer_dialog(pilot, app, str(bad))
        await wait_for(
            pilot,
            lambda: any("not a localfab chat export" in str(n.message) for n in app._notifications),
        )
    assert history.sessions() == []


async def test_export_with_no_saved_chat_says_so(history: History) -> None:
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await app.run_action("screen.export_chat")
        await pilot.pause()
        assert not isinstance(app.screen, TextDialog)
        assert any("no saved chat" in str(n.message) for n in app._notifications)


async def test_palette_lists_search_export_and_import(history: History) -> None:
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        titles = {c.title for c in app.get_system_commands(cast("Screen[object]", chat))}
        assert {"Search chats", "Export chat", "Import chat"} <= titles


class WindowBackend(LocalBackend):
    """The local backend, saying where a resumed chat's window starts."""

    @property
    def window_start(self) -> int | None:
        return None if self._session is None else self._session.window_start


async def test_a_long_session_reopens_with_its_window_rebuilt(history: History) -> None:
    sid = long_chat(history, 14)
    engine = FakeEngine(reply=lambda prompt: "A short reply.", n_ctx=160)
    backend = WindowBackend(
        fake_loader(engine, steps=2), history, "fake-model", ChatOptions(reply_reserve=24)
    )
    assert isinstance(backend, ReportsWindow)
    app = make_app(
        AppDeps(backend=backend, history=history, model_name="fake-model", session_id=sid)
    )
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await wait_for(pilot, lambda: bool(chat.query(ResumeDivider)))
        (divider,) = chat.query(ResumeDivider)
        start = backend.window_start
        assert start is not None and start > 0
        assert divider.turns == start // 2
        assert "outside the window" in str(divider.render())
        assert "the system prompt stayed" in str(divider.render())
        # Every stored turn is still shown, and the divider sits where the window begins.
        views = list(chat.query(MessageView))
        assert len(views) == 28
        log_children = list(chat.query_one("#chat-log").children)
        assert log_children.index(divider) == start
        used, total = backend.context_usage()
        assert 0 < used < total == 160
        ctx = str(chat.query_one("#status-ctx").render())
        assert f"/{total}" in ctx and ctx.startswith("ctx ")


def test_shown_index_follows_merged_continuations() -> None:
    turns = [
        StoredTurn("user", "q"),
        StoredTurn("assistant", "part"),
        StoredTurn("assistant", "part and more"),
        StoredTurn("user", "q2"),
    ]
    assert [shown_index(turns, i) for i in range(4)] == [0, 1, 1, 2]


SIZES = [(100, 30), (80, 24)]
THEMES = ["localfab-dark", "localfab-light"]


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_search_screen_snapshot(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    history = History(tmp_path / "sessions.sqlite3")
    long_chat(history, 3, needle="lighthouse keeper", at=0)
    sid = long_chat(history, 2, needle="lighthouse", at=1)
    history.rename_session(sid, "Coastal questions")
    app, _ = build_app(history, theme=theme, clock_now=FIXED_NOW)

    async def searched(pilot: Pilot[None]) -> None:
        await loaded(pilot, app)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        await pilot.press(*"lighthouse")
        await wait_for(pilot, lambda: len(search_screen(app).hits) == 2)
        app.screen.query_one(Input).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=searched)
    history.close()


async def test_without_fts5_search_still_works_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import localfab.chat.history_schema as history_schema

    monkeypatch.setattr(history_schema, "has_fts5", lambda db: False)
    history = History(tmp_path / "sessions.sqlite3")
    target = long_chat(history, 3, needle="narwhal", at=2)
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)

        def notices() -> int:
            return sum("no FTS5" in str(n.message) for n in app._notifications)

        for _ in range(2):
            await pilot.press("ctrl+f")
            await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is chat)
        assert notices() == 1
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        search = search_screen(app)
        await pilot.press(*"narwhal")
        await wait_for(pilot, lambda: len(search.hits) == 1)
        assert search.hits[0].session_id == target
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(chat.query(".search-hit")))
        assert "narwhal" in chat.query_one(".search-hit", MessageView).text
    history.close()


async def test_arrow_keys_pick_another_hit(history: History) -> None:
    first = long_chat(history, 2, needle="heron", at=0)
    second = long_chat(history, 2, needle="heron", at=1)
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        search = search_screen(app)
        await pilot.press(*"heron")
        await wait_for(pilot, lambda: len(search.hits) == 2)
        wanted = search.hits[1]
        await pilot.press("down", "down", "enter")
        await wait_for(pilot, lambda: bool(chat.query(".search-hit")))
        assert session_of(app) == wanted.session_id
        assert {first, second} == {h.session_id for h in search.hits}
        ids = [m.id for m in history.messages(wanted.session_id)]
        views = list(chat.query(MessageView))
        assert views[ids.index(wanted.message_id)].has_class("search-hit")


@pytest.mark.slow  # a thousand chats written and listed
async def test_a_thousand_chats_are_listed_lazily_and_the_right_one_resumes(
    history: History,
) -> None:
    for i in range(1000):
        sid = history.create_session(model="fake-model")
        history.add_message(sid, "user", f"question number {i}")
        history.add_message(sid, "assistant", f"answer number {i}")
    # Beyond the pages mounted by then (newest first: chat number 999 - 3 * PAGE).
    far = 3 * PAGE
    target = history.sessions()[far]
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app)
        panel = chat.query_one(SessionsPanel)
        await wait_for(pilot, lambda: len(panel.sessions) == 1000)
        # Only a page of items is mounted; the title says how many there are.
        await wait_for(pilot, lambda: len(panel.query(SessionItem)) == PAGE)
        assert "1,000" in str(panel.query_one(".panel-title").render())
        # Walking down the list mounts more as the end comes near (before the page ends). The
        # walk starts a few items short of that point: a key press each is what costs here.
        start = panel.sessions[PAGE - AHEAD - 3].id
        panel.select(start)
        await wait_for(pilot, lambda: panel.selected_id() == start)
        assert len(panel.query(SessionItem)) == PAGE
        panel.query_one("#sessions-list").focus()
        for _ in range(AHEAD):
            await pilot.press("down")
            if len(panel.query(SessionItem)) > PAGE:
                break
        await wait_for(pilot, lambda: len(panel.query(SessionItem)) > PAGE)
        assert len(panel.query(SessionItem)) < far
        # A chat further down than anything mounted is picked and opens.
        panel.select(target.id)
        await wait_for(pilot, lambda: panel.selected_id() == target.id)
        await pilot.press("enter")
        await wait_for(pilot, lambda: session_of(app) == target.id)
        await wait_for(pilot, lambda: len(chat.query(MessageView)) == 2)
        texts = [v.text for v in chat.query(MessageView)]
        number = 999 - far
        assert texts == [f"question number {number}", f"answer number {number}"]
