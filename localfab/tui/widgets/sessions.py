"""The sessions side panel: saved chats, newest first; resume, rename, delete (with undo),
export and import."""

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
        super().__init__(f"── {resume_shift_text(turns)} ──", classes="shift-divider")
        self.turns = turns


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

    def compose(self) -> ComposeResult:
        yield Label("Chats", classes="panel-title")
        yield ListView(id="sessions-list")

    def show(self, sessions: list[StoredSession], current: int | None) -> None:
        """List `sessions`, with `current` (else the first) highlighted."""
        # Queued, so that lists shown one after another are rebuilt in order, each whole.
        self.call_later(self._rebuild, sessions, current)

    async def _rebuild(self, sessions: list[StoredSession], current: int | None) -> None:
        view = self.query_one(ListView)
        if not view.is_mounted:  # queued before the panel was mounted, or after it went away
            return
        try:
            await view.clear()
            await view.extend([SessionItem(s, now=self._now) for s in sessions])
        except MountError:  # the app quit (mid-reply) while the list was being rebuilt
            return
        ids = [s.id for s in sessions]
        view.index = ids.index(current) if current in ids else (0 if ids else None)

    def selected_id(self) -> int | None:
        """The chat highlighted in the list, if any."""
        session = self._selected()
        return None if session is None else session.id

    def select(self, session_id: int) -> None:
        """Highlight a chat in the list (once a list being shown is in place)."""
        self.call_later(self._select, session_id)

    def _select(self, session_id: int) -> None:
        view = self.query_one(ListView)
        for i, item in enumerate(view.children):
            if isinstance(item, SessionItem) and item.session.id == session_id:
                view.index = i
                return

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
