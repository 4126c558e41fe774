"""The search screen while the user types: one search per pause in typing, the search under way
stopped when the words change, and a query too long or too odd answered with a notice."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from textual.widgets import Input

from localfab.chat.history import MAX_TERMS, History, SearchHit
from localfab.tui.app import LocalfabApp
from localfab.tui.screens.search import SearchScreen
from tests.tui_support import build_app, loaded, wait_for

pytestmark = pytest.mark.anyio

GUARD_S = 30.0  # a hang guard: the waits end as soon as what they wait for happens

Search = Callable[..., list[SearchHit]]


def seed(history: History) -> int:
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "where does the axolotl live?")
    history.add_message(sid, "assistant", "The axolotl lives in the lakes of Mexico City.")
    return sid


async def open_search(pilot: object, app: LocalfabApp) -> SearchScreen:
    await pilot.press("ctrl+f")  # type: ignore[attr-defined]
    await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))  # type: ignore[arg-type]
    screen = app.screen
    assert isinstance(screen, SearchScreen)
    return screen


def status(screen: SearchScreen) -> str:
    return str(screen.query_one("#search-status").render())


def spy(app: LocalfabApp, monkeypatch: pytest.MonkeyPatch, around: Search) -> None:
    """Route the app's searches through `around(real, query, limit, cancelled)`."""
    store = app.session_store
    real = store.search

    def search(
        query: str,
        limit: int = 50,
        *,
        cancelled: Callable[[], bool] | None = None,
        thoughts: bool = False,
    ) -> list[SearchHit]:
        assert not thoughts  # these tests search the messages alone
        return around(real, query, limit, cancelled)

    monkeypatch.setattr(store, "search", search)


async def test_typing_a_word_starts_one_search(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = seed(history)
    app, _ = build_app(history)
    asked: list[str] = []

    def counting(
        real: Search, query: str, limit: int, cancelled: Callable[[], bool] | None
    ) -> list[SearchHit]:
        asked.append(query)
        return real(query, limit, cancelled=cancelled)

    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        spy(app, monkeypatch, counting)
        search = await open_search(pilot, app)
        # Far longer than a key press takes here, however busy the machine: the pause that
        # starts the search comes only after the last key.
        search.debounce_s = 1.0
        await pilot.press(*"axolotl")
        await wait_for(pilot, lambda: search.searches == 1)
        assert asked == ["axolotl"]
        assert {h.session_id for h in search.hits} == {sid} and len(search.hits) == 2


async def test_typing_on_stops_the_search_under_way(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(history)
    app, _ = build_app(history)
    started = threading.Event()
    release = threading.Event()
    told: dict[str, Callable[[], bool] | None] = {}

    def held(
        real: Search, query: str, limit: int, cancelled: Callable[[], bool] | None
    ) -> list[SearchHit]:
        told[query] = cancelled
        if query == "ax":  # held mid-search until the test has typed on
            started.set()
            release.wait(GUARD_S)
        return real(query, limit, cancelled=cancelled)

    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        spy(app, monkeypatch, held)
        search = await open_search(pilot, app)
        search.debounce_s = 0.05
        await pilot.press("a", "x")
        await wait_for(pilot, started.is_set)
        stop = told["ax"]
        assert stop is not None and not stop()  # the search is asked whether to go on
        await pilot.press("o")
        try:
            assert stop(), "the search for 'ax' was not told to stop"
        finally:
            release.set()
        await wait_for(pilot, lambda: search.searches >= 1 and told.get("axo") is not None)
        await wait_for(pilot, lambda: len(search.hits) == 2)
        assert search.query_one(Input).value == "axo"


async def test_a_pasted_paragraph_says_which_words_were_searched(history: History) -> None:
    seed(history)
    app, _ = build_app(history)
    paragraph = "where does the axolotl live " + " ".join(f"word{i}" for i in range(100))
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        search = await open_search(pilot, app)
        search.query_one(Input).value = paragraph
        await wait_for(pilot, lambda: search.searches == 1)
        assert f"first {MAX_TERMS} words" in status(search)
        assert "Nothing found for 'where does the axolotl live word0 word1…'" in status(search)


async def test_control_characters_in_the_query_still_search(history: History) -> None:
    sid = seed(history)
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        search = await open_search(pilot, app)
        search.query_one(Input).value = "axolotl\x00lakes"
        await wait_for(pilot, lambda: search.searches == 1)
        assert [h.session_id for h in search.hits] == [sid]
        assert "1 messages" in status(search)
