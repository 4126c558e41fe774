"""The sessions the app lists, renames, deletes and restores, over the chat History (SQLite).

History writes sessions as they stream; what it lacks for a session list (rename, delete and
undo) is done here on its database, in its schema.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localfab.chat.history import History, StoredSession


@dataclass(frozen=True)
class DeletedSession:
    """Everything needed to put a deleted session back (undo)."""

    session: tuple[Any, ...]
    messages: tuple[tuple[Any, ...], ...]


class SessionStore:
    """List, rename, delete and undelete chat sessions."""

    def __init__(self, history: History) -> None:
        self.history = history

    @property
    def _db(self) -> sqlite3.Connection:
        return self.history._db  # the History's own connection: one writer, one WAL

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the History's own thread lock (a reply may be streaming)."""
        lock = getattr(self.history, "_lock", None) or threading.RLock()
        with lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def list(self) -> list[StoredSession]:
        return self.history.sessions()

    def title(self, session: StoredSession) -> str:
        return session.title or "(empty chat)"

    def rename(self, session_id: int, title: str) -> None:
        title = title.strip()[:80]
        if not title:
            raise ValueError("a title cannot be empty")
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET title=?, updated=? WHERE id=?",
                (title, time.time(), session_id),
            )

    def delete(self, session_id: int) -> DeletedSession:
        with self._write() as db:
            session = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
            if session is None:
                raise ValueError(f"no chat session {session_id}")
            messages = db.execute(
                "SELECT * FROM messages WHERE session_id=? ORDER BY seq", (session_id,)
            ).fetchall()
            db.execute("DELETE FROM messages WHERE session_id=?", (session_id,))
            db.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return DeletedSession(tuple(session), tuple(tuple(m) for m in messages))

    def undelete(self, deleted: DeletedSession) -> None:
        with self._write() as db:
            marks = ", ".join("?" * len(deleted.session))
            db.execute(f"INSERT INTO sessions VALUES ({marks})", deleted.session)
            for row in deleted.messages:
                marks = ", ".join("?" * len(row))
                db.execute(f"INSERT INTO messages VALUES ({marks})", row)
