"""Search never holds up the rest of the history: it reads on a connection of its own, stops
when it is no longer wanted, looks for a bounded set of words, and takes any text typed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import localfab.chat.history as history_module
import localfab.chat.history_schema as history_schema
from localfab.chat.history import (
    HIT_END,
    HIT_START,
    MAX_QUERY_CHARS,
    MAX_TERMS,
    History,
    SearchCancelled,
    SearchHit,
    search_terms,
)

# A hang guard, not a timing: each wait below ends as soon as what it waits for happens.
GUARD_S = 30.0


@pytest.fixture(params=["fts5", "like"])
def history(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[History]:
    """A history searched through its FTS5 index, and one through the LIKE fallback."""
    if request.param == "like":
        monkeypatch.setattr(history_schema, "has_fts5", lambda db: False)
    h = History(tmp_path / "h.sqlite3")
    assert h.full_text == (request.param == "fts5")
    yield h
    h.close()


def chat(history: History, *texts: str) -> int:
    sid = history.create_session(model="m")
    for i, text in enumerate(texts):
        history.add_message(sid, "user" if i % 2 == 0 else "assistant", text)
    return sid


class Paused:
    """A `cancelled` callback that holds the search mid-query until released: at its 20th
    progress check (each VM step here), well inside the query's read transaction."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.stop = False
        self.checks = 0

    def __call__(self) -> bool:
        self.checks += 1
        if self.checks >= 20:
            self.inside.set()
            self.release.wait(3 * GUARD_S)  # outlasts any wait of the test's own
            return self.stop
        return False

    def reached(self, search: threading.Thread) -> bool:
        """Wait until the search is held mid-query; False if it ended without getting there."""
        while not self.inside.wait(0.01):
            if not search.is_alive():
                return False
        return True


def search_in_thread(
    history: History, query: str, cancelled: Callable[[], bool]
) -> tuple[threading.Thread, list[object]]:
    """Run a search in a thread; its hits, or the exception it raised, land in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(history.search(query, cancelled=cancelled))
        except BaseException as exc:  # looked at by the test, not lost in the thread
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_calls_and_writes_go_on_while_a_search_is_mid_query(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "SEARCH_CHECK_STEPS", 1)  # pause at its first steps
    sid = chat(history, "the lighthouse keeper", "a lighthouse lamp")
    reply = history.add_message(sid, "assistant", "", status="generating")
    history.search("lighthouse")  # its connection has read the schema: checks now come mid-query
    paused = Paused()
    searching, out = search_in_thread(history, "lighthouse", paused)
    assert paused.reached(searching), out  # the search is inside SQLite, in a read transaction

    done: list[object] = []

    def other_calls() -> None:
        done.append([s.id for s in history.sessions()])
        history.update_message(reply, "the lighthouse is tall", status="complete")
        done.append(history.add_message(sid, "user", "and the lighthouse lens?"))
        history.rename_session(sid, "Lighthouses")
        done.append("renamed")

    others = threading.Thread(target=other_calls, daemon=True)
    others.start()
    others.join(GUARD_S)
    # Both read before the search is let go: the calls ended while it was held mid-query.
    calls_done, still_searching = not others.is_alive(), searching.is_alive()
    paused.release.set()
    searching.join(GUARD_S)
    others.join(GUARD_S)
    assert calls_done, "a call waited for the search"
    assert still_searching
    assert done[0] == [sid] and len(done) == 3
    (hits,) = out
    assert isinstance(hits, list) and len(hits) == 2  # what was committed when it began
    assert len(history.search("lighthouse")) == 4


def test_a_search_no_longer_wanted_stops_mid_query(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "SEARCH_CHECK_STEPS", 1)
    chat(history, "the lighthouse keeper", "a lighthouse lamp")
    paused = Paused()
    paused.stop = True  # superseded while it runs
    searching, out = search_in_thread(history, "lighthouse", paused)
    assert paused.reached(searching), out
    paused.release.set()
    searching.join(GUARD_S)
    (raised,) = out
    assert isinstance(raised, SearchCancelled)
    # The connection it used is back in service and no longer asks the stopped search.
    assert len(history.search("lighthouse")) == 2
    assert len(history.search("lighthouse", cancelled=lambda: False)) == 2


def test_searches_at_once_do_not_wait_for_each_other(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "SEARCH_CHECK_STEPS", 1)
    chat(history, "the lighthouse keeper", "a lighthouse lamp")
    paused = Paused()
    first, out = search_in_thread(history, "keeper", paused)
    assert paused.reached(first), out
    second, second_out = search_in_thread(history, "lamp", lambda: False)
    second.join(GUARD_S)
    second_done = not second.is_alive()
    paused.release.set()
    first.join(GUARD_S)
    assert second_done, "the second search waited for the first"
    found = [hits for hits in (*out, *second_out) if isinstance(hits, list)]
    assert [[h.role for h in hits] for hits in found] == [["user"], ["assistant"]]


def test_query_words_are_distinct_and_capped() -> None:
    terms = search_terms("The the THE cat the")
    assert terms.words == ("The", "cat") and not terms.prefix and not terms.capped
    assert search_terms("the cat th").words == ("the", "cat", "th")
    assert search_terms("the cat th").prefix  # still being typed
    words = [f"w{i}" for i in range(100)]
    terms = search_terms(" ".join(words))
    assert terms.words == tuple(words[:MAX_TERMS]) and terms.capped and not terms.prefix
    # A word the index splits into tokens costs each of them.
    dotted = ".".join(["a"] * (MAX_TERMS + 5))
    assert search_terms(dotted).words == (".".join(["a"] * MAX_TERMS),)
    assert search_terms("x y " + dotted).words == ("x", "y")
    # A pasted page is read only so far.
    page = "word " * 10 + "z" * (2 * MAX_QUERY_CHARS)
    assert len(search_terms(page).words[-1]) < MAX_QUERY_CHARS
    assert search_terms("a " * 5000).words == ("a",)


def test_a_pasted_paragraph_finds_its_message(history: History) -> None:
    sentence = (
        "the keeper of the lighthouse climbs the stairs every evening to light the lamp and "
        "watch the ships pass the rocks while the sea breaks against the old stone walls"
    )
    paragraph = " ".join([sentence] * 3)
    sid = chat(history, "a question about lighthouses", paragraph, "the sea is calm tonight")
    hits = history.search(paragraph)
    assert [(h.session_id, h.role) for h in hits] == [(sid, "assistant")]
    assert [h.role for h in history.search(" ".join(["the"] * 100))] != []


@pytest.mark.parametrize(
    "query", ["\x00", "lighthouse\ud800", "\ud800", "light\ud800house", "\udfff lighthouse"]
)
def test_text_no_message_can_hold_finds_nothing(history: History, query: str) -> None:
    chat(history, "the lighthouse keeper")
    assert history.search(query) == []


def test_control_characters_separate_words(history: History) -> None:
    sid = chat(history, "the lighthouse keeper")
    for query in ("lighthouse\x00", "\x00keeper", "lighthouse\x00keeper", "keeper\x1b"):
        hits: list[SearchHit] = history.search(query)
        assert [h.session_id for h in hits] == [sid], query
        assert HIT_START in hits[0].snippet and HIT_END in hits[0].snippet
