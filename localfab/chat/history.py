"""Chat sessions on disk (SQLite in WAL mode), written so that nothing already said is lost.

The user's message is stored before generation starts and the reply while it grows, so Ctrl-C or
a killed process leaves the partial reply in the database; a reply still marked `generating` when
the database is next opened was cut off and is marked `interrupted`. The schema is versioned with
SQLite's `user_version`; each migration runs once, in order.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

# Each entry moves the schema from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        model TEXT NOT NULL,
        system TEXT,
        title TEXT
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'complete',
        continues INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        UNIQUE (session_id, seq)
    );
    """,
)

STATUSES = ("complete", "generating", "length", "interrupted")


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str
    status: str
    continues: int


@dataclass(frozen=True)
class StoredSession:
    id: int
    model: str
    system: str | None
    title: str | None
    created: float
    updated: float


class History:
    """One SQLite database of chat sessions."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()
        # Replies that were being written when a process died were cut off.
        self._db.execute("UPDATE messages SET status='interrupted' WHERE status='generating'")

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        for i in range(version, len(MIGRATIONS)):
            self._db.execute("BEGIN")
            try:
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={i + 1}")
                self._db.execute("COMMIT")
            except Exception:
                self._db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    # --- sessions ------------------------------------------------------------------------------

    def create_session(self, *, model: str, system: str | None = None) -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO sessions (created, updated, model, system) VALUES (?, ?, ?, ?)",
            (now, now, model, system),
        )
        return int(cur.lastrowid or 0)

    def session(self, session_id: int) -> StoredSession | None:
        row = self._db.execute(
            "SELECT id, model, system, title, created, updated FROM sessions WHERE id=?",
            (session_id,),
        ).fetchone()
        return StoredSession(*row) if row else None

    def sessions(self) -> list[StoredSession]:
        rows = self._db.execute(
            "SELECT id, model, system, title, created, updated FROM sessions ORDER BY updated DESC"
        ).fetchall()
        return [StoredSession(*r) for r in rows]

    def messages(self, session_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT id, role, content, status, continues FROM messages "
            "WHERE session_id=? ORDER BY seq",
            (session_id,),
        ).fetchall()
        return [StoredMessage(*r) for r in rows]

    # --- messages ------------------------------------------------------------------------------

    def add_message(
        self, session_id: int, role: str, content: str, *, status: str = "complete"
    ) -> int:
        now = time.time()
        seq = self._db.execute(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE session_id=?", (session_id,)
        ).fetchone()[0]
        cur = self._db.execute(
            "INSERT INTO messages (session_id, seq, role, content, status, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (session_id, seq, role, content, status, now, now),
        )
        self._db.execute("UPDATE sessions SET updated=? WHERE id=?", (now, session_id))
        if role == "user":
            self._db.execute(
                "UPDATE sessions SET title=? WHERE id=? AND title IS NULL",
                (content.strip().splitlines()[0][:80] if content.strip() else None, session_id),
            )
        return int(cur.lastrowid or 0)

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        status: str | None = None,
        continues: int | None = None,
    ) -> None:
        sets, args = ["content=?", "updated=?"], [content, time.time()]
        if status is not None:
            sets.append("status=?")
            args.append(status)
        if continues is not None:
            sets.append("continues=?")
            args.append(continues)
        args.append(message_id)
        self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", args)
