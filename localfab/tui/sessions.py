"""The sessions the app lists, renames, deletes, restores, searches, exports and imports.

A thin layer over the chat History (SQLite): the History does the work in its own write
transactions; this adds what only the app needs (a title for an untitled chat, files on disk).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from pathlib import Path

from localfab.chat.history import (
    DeletedSession,
    History,
    SearchHit,
    StoredSession,
)
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.errors import UsageError

__all__ = ["DeletedSession", "SessionStore"]


class SessionStore:
    """List, rename, delete and undelete, search, export and import chat sessions."""

    def __init__(self, history: History) -> None:
        self.history = history

    def list(self) -> list[StoredSession]:
        return self.history.sessions()

    def title(self, session: StoredSession) -> str:
        return session.title or "(empty chat)"

    def rename(self, session_id: int, title: str) -> None:
        self.history.rename_session(session_id, title)

    def delete(self, session_id: int) -> DeletedSession:
        return self.history.delete_session(session_id)

    def undelete(self, deleted: DeletedSession) -> int:
        return self.history.restore_session(deleted)

    def search(
        self,
        query: str,
        limit: int = 50,
        *,
        cancelled: Callable[[], bool] | None = None,
        thoughts: bool = False,
    ) -> builtins.list[SearchHit]:
        """See `History.search`: `cancelled` stops a search mid-query (`SearchCancelled`);
        `thoughts` looks in thinking models' thoughts too."""
        return self.history.search(query, limit, cancelled=cancelled, thoughts=thoughts)

    def export(self, session_id: int, path: Path) -> Path:
        """Write a session to `path`: JSON for a .json name, Markdown otherwise."""
        path = path.expanduser()
        if path.suffix.lower() == ".json":
            text = export_json(self.history, session_id)
        else:
            text = export_markdown(self.history, session_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"could not write {path}: {exc.strerror or exc}") from exc
        return path

    def import_file(self, path: Path) -> int:
        """Store a chat exported as JSON as a new session; returns its id."""
        path = path.expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"could not read {path}: {exc}") from exc
        return import_json(self.history, text)
