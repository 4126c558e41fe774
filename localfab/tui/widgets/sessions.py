"""The sessions side panel: saved chats, newest first; resume, rename, delete (with undo),
export and import.

The list is built lazily: a page of items at first, and more as the highlight or the scroll
position nears the end, so a history of thousands of chats opens as fast as one of ten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import MountError
from textual.widgets import Label, ListItem, ListView, Static

from localfab.chat.history import StoredSession
from localfab.textsafe import visible_controls


def when(timestamp: float, now: float | None = None) -> str:
    """A short age: 'now', '5m', '3h', '2d'."""
    age = max(0.0, (time.time() if now is None else now) - timestamp)
    if age < 60:
        return "now"
    if age < 3600:
        return f"{age / 60:.0f}m"
    if age < 86400:
        return f"{age / 3600:.0f}h"
    return f"{age / 86400:.0f}d"


def resume_shift_text(turns: int) -> str:
    """The words of the divider a resumed chat shows where its window starts."""
    noun = "turn is" if turns == 1 else "turns are"
    return f"{turns} earlier {noun} outside the window (shown, not sent); the system prompt stayed"


class ResumeDivider(Static):
    """Where a resumed chat's window starts: the turns above it are not sent to the model."""

    def __init__(self, turns: int) -> None:
        super().__init__(f"── {resume_shift_text(turns)} ──", classes="shift-divider", markup=False)
        self.turns = turns


class SessionItem(ListItem):
    def __init__(self, session: StoredSession, *, now: float | None = None) -> None:
        super().__init__(classes="session-item")
        self.session = session
        self._now = now

    def compose(self) -> ComposeResult:
        title = visible_controls(self.session.title or "(empty chat)")
        yield Label(title, classes="session-title", markup=False)
        yield Label(
            f"{self.session.model or '?'} · {when(self.session.updated, self._now)}",
            classes="session-meta",
            markup=False,
        )


PAGE = 40  # items mounted at a time
FIRST = 16  # items in the first paint: a screenful at two lines each
AHEAD = 10  # mount the next page when the highlight or the view comes this close to the end


class SessionsList(ListView):
    """The list of chats; it asks its panel for more items as it nears its end."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        near_end = self.max_scroll_y > 0 and new_value >= self.max_scroll_y - AHEAD
        if near_end and isinstance(self.parent, SessionsPanel):
            self.parent.want_more()


class SessionsPanel(Vertical):
    """A list of saved chats. The screen does the work; the panel says what was asked."""

    BINDINGS = [
        Binding("enter", "open", "Open", id="sessions.open"),
        Binding("f2,r", "rename", "Rename", id="sessions.rename"),
        Binding("delete,d", "delete", "Delete", id="sessions.delete"),
        Binding("e", "export", "Export", id="sessions.export"),
        Binding("i", "import", "Import", id="sessions.import"),
    ]

    @dataclass
    class OpenRequested(Message):
        session_id: int

    @dataclass
    class RenameRequested(Message):
        session_id: int
        title: str

    @dataclass
    class DeleteRequested(Message):
        session_id: int

    @dataclass
    class ExportRequested(Message):
        session_id: int

    class ImportRequested(Message):
        pass

    def __init__(self, *, now: float | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._now = now  # a fixed clock for snapshots
        self.sessions: list[StoredSession] = []  # every chat listed, mounted or not yet
        self._current: int | None = None  # the chat `show` last asked to highlight
        self._growing = False

    def compose(self) -> ComposeResult:
        yield Label("Chats", classes="panel-title", markup=False)
        yield SessionsList(id="sessions-list")

    def show(self, sessions: list[StoredSession], current: int | None) -> None:
        """List `sessions`, with `current` (else the first) highlighted."""
        # Queued, so that lists shown one after another are rebuilt in order, each whole.
        self.call_later(self._rebuild, sessions, current)

    @property
    def mounted_count(self) -> int:
        """How many of the listed chats have an item in the list so far."""
        return len(self.query_one(ListView).children)

    async def _rebuild(self, sessions: list[StoredSession], current: int | None) -> None:
        view = self.query_one(ListView)
        if not view.is_mounted:  # queued before the panel was mounted, or after it went away
            return
        if view.children and sessions == self.sessions and current == self._current:
            return  # nothing changed: the items, and where the user moved the highlight, stay
        self._current = current
        self.sessions = list(sessions)
        ids = [s.id for s in sessions]
        at = ids.index(current) if current in ids else (0 if ids else None)
        first = max(PAGE, (at or 0) + AHEAD)
        self.query_one(".panel-title", Label).update(
            f"Chats ({len(sessions):,})" if len(sessions) > PAGE else "Chats"
        )
        items = [SessionItem(s, now=self._now) for s in sessions[:first]]
        try:
            if view.children:
                # Hold the paint while the old items go and the new ones come: no blank flash.
                with self.app.batch_update():
                    await view.clear()
                    await view.extend(items)
            else:
                # The first fill (at start): no paint is held back, so the first frame does
                # not wait for the list, and a screenful comes first, the rest after a paint.
                now = FIRST if (at or 0) + AHEAD <= FIRST else len(items)
                await view.extend(items[:now])
                if len(items) > now:
                    self._growing = True
                    self.call_after_refresh(self._grow, len(items), exactly=True)
        except MountError:  # the app quit (mid-reply) while the list was being rebuilt
            return
        view.index = at

    def want_more(self) -> None:
        """Mount the next page of items, if any are left (once at a time)."""
        if not self._growing and self.mounted_count < len(self.sessions):
            self._growing = True
            self.call_later(self._grow)

    async def _grow(self, upto: int | None = None, *, exactly: bool = False) -> None:
        """Mount the next page, or up to `upto` items (at least, or `exactly` that many)."""
        view = self.query_one(ListView)
        try:
            have = len(view.children)
            end = (upto or 0) if exactly else max(have + PAGE, upto or 0)
            more = [SessionItem(s, now=self._now) for s in self.sessions[have:end]]
            if more and view.is_mounted:
                await view.extend(more)
        except MountError:
            pass
        finally:
            self._growing = False

    @on(ListView.Highlighted)
    def _highlighted(self, event: ListView.Highlighted) -> None:
        event.stop()
        index = event.list_view.index
        if index is not None and index >= self.mounted_count - AHEAD:
            self.want_more()

    def selected_id(self) -> int | None:
        """The chat highlighted in the list, if any."""
        session = self._selected()
        return None if session is None else session.id

    def select(self, session_id: int) -> None:
        """Highlight a chat in the list (once a list being shown is in place)."""
        self.call_later(self._select, session_id)

    async def _select(self, session_id: int) -> None:
        ids = [s.id for s in self.sessions]
        if session_id not in ids:
            return
        at = ids.index(session_id)
        view = self.query_one(ListView)
        if at >= len(view.children):
            await self._grow(upto=at + AHEAD)
        view.index = at

    def _selected(self) -> StoredSession | None:
        item = self.query_one(ListView).highlighted_child
        return item.session if isinstance(item, SessionItem) else None

    @on(ListView.Selected)
    def _picked(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, SessionItem):
            self.post_message(self.OpenRequested(event.item.session.id))

    def action_open(self) -> None:
        session = self._selected()
        if session is not None:
            self.post_message(self.OpenRequested(session.id))

    def action_rename(self) -> None:
        session = self._selected()
        if session is not None:
            self.post_message(self.RenameRequested(session.id, session.title or ""))

    def action_delete(self) -> None:
        session = self._selected()
        if session is not None:
            self.post_message(self.DeleteRequested(session.id))

    def action_export(self) -> None:
        session = self._selected()
        if session is not None:
            self.post_message(self.ExportRequested(session.id))

    def action_import(self) -> None:
        self.post_message(self.ImportRequested())
