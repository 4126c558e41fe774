"""The chat screen's saved-chat actions: open, rename, delete and undo, search, export, import.

A mixin of `ChatScreen` (its methods take the screen as `self`); the sessions panel's messages
are handled here by name (`on_sessions_panel_...`), as Textual finds such handlers on every
class of the screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.message import Message

from localfab.chat.history import SearchHit
from localfab.errors import LocalfabError
from localfab.tui.backend import ReportsWindow, StoredTurn
from localfab.tui.screens.chat_parts import ChatHost
from localfab.tui.screens.search import SearchScreen
from localfab.tui.widgets.dialogs import TextDialog
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.sessions import SessionsPanel


@dataclass
class SessionOpened(Message):
    turns: list[StoredTurn]
    highlight: int | None = None  # index in turns of a search hit to show
    window_start: int | None = None  # index in turns of the first one in the window


class SessionActions(ChatHost):
    """Saved chats, as the chat screen offers them."""

    async def action_new_chat(self) -> None:
        if self.streaming or not self.loaded:
            return
        self._open(None)

    def action_toggle_sessions(self) -> None:
        panel = self.query_one(SessionsPanel)
        self._panel_user_set = True
        panel.display = not panel.display
        if panel.display:
            self.refresh_sessions()
            panel.query_one("#sessions-list").focus()
        else:
            self.query_one(PromptBox).focus()

    def refresh_sessions(self) -> None:
        store = self.lf_app.session_store
        current = self.backend.session_id if self.backend is not None else None
        self.query_one(SessionsPanel).show(store.list(), current)

    def _open(self, session_id: int | None, *, message_id: int | None = None) -> None:
        self._open_worker(session_id, message_id)

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _open_worker(self, session_id: int | None, message_id: int | None = None) -> None:
        assert self.backend is not None
        try:
            if message_id is not None:
                # A search hit may be in another version: the chat opens on the path through it.
                self.lf_app.history.switch_to(message_id)
            turns = self.backend.open_session(session_id=session_id, system=self.system)
        except (LocalfabError, ValueError, OSError) as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        highlight = None
        if message_id is not None:
            ids = [t.message_id for t in turns]
            highlight = ids.index(message_id) if message_id in ids else None
        start = self.backend.window_start if isinstance(self.backend, ReportsWindow) else None
        self.post_message(SessionOpened(turns, highlight, start))

    async def action_undo_delete(self) -> None:
        if self._deleted is None:
            return
        self.lf_app.session_store.undelete(self._deleted)
        self._deleted = None
        self.refresh_sessions()
        self.notify("Chat restored.")

    def on_sessions_panel_open_requested(self, event: SessionsPanel.OpenRequested) -> None:
        if self.streaming:
            self.notify("Stop the reply (Esc) before switching chats.", severity="warning")
            return
        if not self.loaded:
            self.notify("Load a model to resume a chat.", severity="warning")
            return
        self._open(event.session_id)

    def on_sessions_panel_rename_requested(self, event: SessionsPanel.RenameRequested) -> None:
        def renamed(title: str | None) -> None:
            if title is None:
                return
            try:
                self.lf_app.session_store.rename(event.session_id, title)
            except LocalfabError as exc:
                self.notify(str(exc), severity="warning")
            self.refresh_sessions()

        self.app.push_screen(TextDialog("Rename chat", event.title), renamed)

    def on_sessions_panel_delete_requested(self, event: SessionsPanel.DeleteRequested) -> None:
        current = self.backend.session_id if self.backend is not None else None
        if event.session_id == current:
            self.notify("This chat is open: start a new one (Ctrl+N) first.", severity="warning")
            return
        try:
            self._deleted = self.lf_app.session_store.delete(event.session_id)
        except LocalfabError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.refresh_sessions()
        self.notify("Chat deleted. Ctrl+Z brings it back.", timeout=6)

    def action_search(self) -> None:
        """Search every saved chat; the hit picked opens at its message."""

        def picked(hit: SearchHit | None) -> None:
            if hit is None:
                return
            if self.streaming:
                self.notify("Stop the reply (Esc) before switching chats.", severity="warning")
                return
            if not self.loaded:
                self.notify("Load a model to open a chat.", severity="warning")
                return
            self._open(hit.session_id, message_id=hit.message_id)

        history = self.lf_app.history
        if history.search_notice and not self._search_notice_shown:
            self._search_notice_shown = True
            self.notify(history.search_notice, title="Search", severity="warning", timeout=8)
        self.app.push_screen(SearchScreen(self.lf_app.session_store), picked)

    def _export_target(self, session_id: int | None) -> int | None:
        if session_id is None:
            session_id = self.query_one(SessionsPanel).selected_id()
            if session_id is None and self.backend is not None:
                session_id = self.backend.session_id
        if session_id is None:
            self.notify("There is no saved chat to export yet.", severity="warning")
        return session_id

    def action_export_chat(self, session_id: int | None = None) -> None:
        """Export a chat (the one picked in the list, else the open one) to a file."""
        target = self._export_target(session_id)
        if target is None:
            return

        def chosen(path: str | None) -> None:
            if not path or not path.strip():
                return
            try:
                written = self.lf_app.session_store.export(target, Path(path.strip()))
            except LocalfabError as exc:
                self.notify(str(exc), title="Export", severity="error", timeout=8)
                return
            except Exception as exc:  # noqa: BLE001 - a damaged chat must not end the app
                self.notify(_failed("export", exc), title="Export", severity="error", timeout=8)
                return
            self.notify(f"Chat exported to {written}.", title="Export")

        default = str(Path.cwd() / f"localfab-chat-{target}.md")
        self.app.push_screen(
            TextDialog("Export chat to a file (.md for Markdown, .json to import later)", default),
            chosen,
        )

    def action_import_chat(self) -> None:
        """Import a chat exported as JSON, as a new saved chat."""

        def chosen(path: str | None) -> None:
            if not path or not path.strip():
                return
            try:
                session_id = self.lf_app.session_store.import_file(Path(path.strip()))
            except LocalfabError as exc:
                self.notify(str(exc), title="Import", severity="error", timeout=8)
                return
            except Exception as exc:  # noqa: BLE001 - a hostile file must not end the app
                self.notify(_failed("import", exc), title="Import", severity="error", timeout=8)
                return
            self.refresh_sessions()
            self.query_one(SessionsPanel).select(session_id)
            self.notify("Chat imported: Enter in the list opens it.", title="Import")

        self.app.push_screen(TextDialog("Import a chat from a JSON export", ""), chosen)

    def on_sessions_panel_export_requested(self, event: SessionsPanel.ExportRequested) -> None:
        self.action_export_chat(event.session_id)

    def on_sessions_panel_import_requested(self) -> None:
        self.action_import_chat()


def _failed(what: str, exc: Exception) -> str:
    """The notice for an export or import that failed in a way nobody foresaw, and what went
    wrong (an import is one transaction: a failed one stored nothing)."""
    stored = "; nothing was stored" if what == "import" else ""
    return f"The {what} failed{stored}: {type(exc).__name__}: {exc}"
