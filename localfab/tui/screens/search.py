"""Full-text search over every saved chat; picking a hit opens its chat at that message.

A search starts once typing pauses (`DEBOUNCE_S`), in a thread, and is stopped mid-query as
soon as the words change: only the search for what the box holds now ever runs to the end.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Input, Label, ListItem, ListView
from textual.worker import get_current_worker

from localfab.chat.history import SearchCancelled, SearchHit, search_terms, split_hits
from localfab.errors import LocalfabError
from localfab.textsafe import visible_controls
from localfab.tui.sessions import SessionStore

RESULTS = 50
# Typing must pause this long before a search starts: a word typed quickly starts one search,
# not one per key, of which all but the last would be thrown away.
DEBOUNCE_S = 0.25
QUOTED_CHARS = 40  # of the query, in "Nothing found for ..." (a pasted page would fill it)
HIT_STYLE = "bold reverse"  # readable on every theme without a colour of its own


def snippet_content(snippet: str) -> Content:
    """A snippet with its matches styled, the rest as plain text (never markup)."""
    return Content.assemble(
        *(
            (visible_controls(text), HIT_STYLE) if hit else visible_controls(text)
            for text, hit in split_hits(snippet)
        )
    )


class HitItem(ListItem):
    def __init__(self, hit: SearchHit) -> None:
        super().__init__(classes="search-hit-item")
        self.hit = hit

    def compose(self) -> ComposeResult:
        who = "You" if self.hit.role == "user" else self.hit.role.title()
        yield Label(
            Content(visible_controls(f"{self.hit.title or '(untitled chat)'} · {who}")),
            classes="search-hit-title",
            markup=False,
        )
        yield Label(snippet_content(self.hit.snippet), classes="search-hit-snippet", markup=False)


class SearchScreen(ModalScreen[SearchHit | None]):
    """Type to search all messages; Enter or a click on a hit opens it, Esc closes."""

    CSS_PATH = "search.tcss"  # loaded when the screen first opens

    BINDINGS = [
        Binding("escape", "cancel", "Close", id="search.close"),
        Binding("down", "to_results", "Results", id="search.results", show=False),
        Binding("f3,alt+t", "thoughts", "Thoughts too", id="search.thoughts"),
    ]

    @dataclass
    class ResultsFound(Message):
        query: str
        hits: list[SearchHit]
        error: str | None = None  # why the search failed, if it did

    def __init__(self, store: SessionStore, query: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.store = store
        self.query_text = query
        self.hits: list[SearchHit] = []
        self.searches = 0  # searches answered, for tests
        self.debounce_s = DEBOUNCE_S
        self._pending: Timer | None = None  # the search waiting for typing to pause
        self.thoughts = False  # thinking models' thoughts are searched too

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog search-dialog"):
            yield Label("Search chats", classes="dialog-title", markup=False)
            yield Input(self.query_text, placeholder="Words to find", id="search-input")
            yield Label(self._hint(), id="search-status", markup=False)
            yield ListView(id="search-results")

    def _hint(self) -> str:
        notice = self.store.history.search_notice
        where = " and their thoughts" if self.thoughts else " (F3: thoughts too)"
        return notice or f"Type to search every saved chat{where}; Enter opens a hit."

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        if self.query_text.strip():
            self._search(self.query_text)

    @on(Input.Changed, "#search-input")
    def _changed(self, event: Input.Changed) -> None:
        # The search under way is for words no longer in the box: stop it now, not when done.
        self.workers.cancel_group(self, "search")
        if self._pending is not None:
            self._pending.stop()
            self._pending = None
        query = event.value
        if not query.strip():
            self._search(query)  # nothing to look up: the hint comes back at once
            return
        self._pending = self.set_timer(self.debounce_s, lambda: self._search(query))

    @work(thread=True, exclusive=True, group="search", exit_on_error=False)
    def _search(self, query: str) -> None:
        # A thread: the database may be busy with another process's write for a moment.
        worker = get_current_worker()
        try:
            cancelled = lambda: worker.is_cancelled  # noqa: E731
            hits = (
                self.store.search(query, RESULTS, cancelled=cancelled, thoughts=self.thoughts)
                if query.strip()
                else []
            )
        except SearchCancelled:
            return  # newer words replaced these; their own search answers
        except (sqlite3.Error, LocalfabError) as exc:
            self.post_message(self.ResultsFound(query, [], error=str(exc)))
            return
        self.post_message(self.ResultsFound(query, hits))

    @on(ResultsFound)
    async def _results_found(self, event: ResultsFound) -> None:
        if event.query != self.query_one(Input).value:
            return  # an older search answered late
        view = self.query_one(ListView)
        await view.clear()
        await view.extend([HitItem(h) for h in event.hits])
        view.index = 0 if event.hits else None
        status = self.query_one("#search-status", Label)
        terms = search_terms(event.query)
        capped = f" (searched for the first {len(terms.words)} words)" if terms.capped else ""
        if event.error is not None:
            status.update(f"Search failed: {event.error}")
        elif not event.query.strip():
            status.update(self._hint())
        elif not event.hits:
            quoted = " ".join(event.query.split())
            if len(quoted) > QUOTED_CHARS:
                quoted = quoted[: QUOTED_CHARS - 1] + "…"
            status.update(f"Nothing found for {quoted!r}{capped}.")
        else:
            more = "+" if len(event.hits) == RESULTS else ""
            status.update(f"{len(event.hits)}{more} messages{capped}; ↓ then Enter opens one.")
        # Last, so that a search counts as answered once all of its answer is on the screen.
        self.hits = event.hits
        self.searches += 1

    @on(Input.Submitted, "#search-input")
    def _submitted(self) -> None:
        if self.hits:
            self.dismiss(self._current())

    def _current(self) -> SearchHit:
        view = self.query_one(ListView)
        item = view.highlighted_child
        return item.hit if isinstance(item, HitItem) else self.hits[0]

    @on(ListView.Selected, "#search-results")
    def _picked(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, HitItem):
            self.dismiss(event.item.hit)

    def action_to_results(self) -> None:
        if self.hits and self.query_one(Input).has_focus:
            self.query_one(ListView).focus()

    def action_thoughts(self) -> None:
        """Search thinking models' thoughts too, or no longer."""
        self.thoughts = not self.thoughts
        self.notify(f"Thoughts are {'searched too' if self.thoughts else 'left out'}.")
        self.workers.cancel_group(self, "search")
        query = self.query_one(Input).value
        self._search(query)

    def action_cancel(self) -> None:
        self.dismiss(None)
