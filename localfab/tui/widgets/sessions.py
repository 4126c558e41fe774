"""The sessions side panel: saved chats, newest first; resume, rename, delete (with undo)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, ListItem, ListView

from localfab.chat.history import StoredSession


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


class SessionItem(ListItem):
    def __init__(self, session: StoredSession, *, now: float | None = None) -> None:
        super().__init__(classes="session-item")
        self.session = session
        self._now = now

    def compose(self) -> ComposeResult:
        title = self.session.title or "(empty chat)"
        yield Label(title, classes="session-title", markup=False)
        yield Label(
            f"{self.session.model or '?'} · {when(self.session.updated, self._now)}",
            classes="session-meta",
            markup=False,
        )


class SessionsPanel(Vertical):
    """A list of saved chats. The screen does the work; the panel says what was asked."""

    BINDINGS = [
        Binding("enter", "open", "Open", id="sessions.open"),
        Binding("f2,r", "rename", "Rename", id="sessions.rename"),
        Binding("delete,d", "delete", "Delete", id="sessions.delete"),
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

    def __init__(self, *, now: float | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._now = now  # a fixed clock for snapshots

    def compose(self) -> ComposeResult:
        yield Label("Chats", classes="panel-title")
        yield ListView(id="sessions-list")

    def show(self, sessions: list[StoredSession], current: int | None) -> None:
        view = self.query_one(ListView)
        view.clear()
        items = [SessionItem(s, now=self._now) for s in sessions]
        view.extend(items)
        ids = [s.id for s in sessions]
        view.index = ids.index(current) if current in ids else (0 if ids else None)

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
