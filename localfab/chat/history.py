"""Chat sessions on disk (SQLite in WAL mode), written so that nothing already said is lost.

The user's message is stored before generation starts and the reply while it grows, so Ctrl-C or
a killed process leaves the partial reply in the database. Several processes may share the
database (a chat in the terminal app, `localfab run`, the server): each message's place in its
session (`seq`) is allocated inside a write transaction, so two writers never collide.

A reply being generated is marked `generating`, and its writer holds an OS file lock named after
the reply for as long as it writes. The operating system drops the lock when the writer exits,
however it exits, so whoever opens the database later can tell a live reply (lock held: leave it)
from a cut-off one (lock free: mark it `interrupted`). The locks come from `filelock` (flock on
Unix, LockFileEx on Windows), in a folder beside the database.

The schema is versioned with SQLite's `user_version`; each migration runs once, in order.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

# How long a writer waits for another process's write transaction before giving up. Writes are
# single small transactions, so any wait beyond a moment means a stuck process.
BUSY_TIMEOUT_S = 30.0


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
    """One SQLite database of chat sessions, safe to share between processes and threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Resolved, so that processes naming the database by different paths share the locks.
        real = path.resolve()
        self.locks_dir = real.with_name(real.name + ".writing")
        # The connection is shared by the threads of one process (a UI thread and a worker):
        # the lock keeps one thread's transaction from interleaving with another's statements.
        self._lock = threading.RLock()
        self._reply_locks: dict[int, Any] = {}  # message id -> held filelock.FileLock
        self._db = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S
        )
        self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()
        self.mark_interrupted()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding SQLite's write lock from its first statement.

        `BEGIN IMMEDIATE` takes the lock up front (waiting up to the busy timeout for another
        writer), so what is read inside, such as the next `seq`, cannot change before the write.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # some errors end the transaction themselves
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _migrate(self) -> None:
        for i in range(self.schema_version, len(MIGRATIONS)):
            with self._write() as db:
                # Another process may have migrated while this one waited for the lock.
                if int(db.execute("PRAGMA user_version").fetchone()[0]) != i:
                    continue
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={i + 1}")

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        """Close the database; replies this object was still writing are marked interrupted."""
        with self._lock:
            for message_id in list(self._reply_locks):
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute(
                        "UPDATE messages SET status='interrupted' "
                        "WHERE id=? AND status='generating'",
                        (message_id,),
                    )
                self._release_reply(message_id)
            self._db.close()

    # --- replies being written -----------------------------------------------------------------

    def _reply_lock(self, message_id: int) -> Any:
        from filelock import FileLock  # imported when a reply is written or checked, not before

        self.locks_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(self.locks_dir / f"{message_id}.lock", thread_local=False)

    def _release_reply(self, message_id: int) -> None:
        lock = self._reply_locks.pop(message_id, None)
        if lock is None:
            return
        lock.release()
        with contextlib.suppress(OSError):
            Path(lock.lock_file).unlink()

    def mark_interrupted(self) -> int:
        """Mark replies `interrupted` whose writer is gone; returns how many.

        A reply is `generating` while some process writes it, holding its file lock. If the
        lock can be taken, nobody holds it: the writer exited or was killed mid-reply. A live
        writer's reply is left alone. Run when the database is opened.
        """
        with self._lock:
            rows = self._db.execute("SELECT id FROM messages WHERE status='generating'").fetchall()
        if not rows:
            return 0
        from filelock import Timeout

        marked = 0
        for (message_id,) in rows:
            if message_id in self._reply_locks:
                continue  # this object is writing it
            try:
                lock = self._reply_lock(message_id)
                lock.acquire(timeout=0)
            except Timeout:
                continue  # its writer is alive
            except OSError:
                continue  # the lock folder cannot be written: cannot tell, leave the reply be
            try:
                with self._lock:
                    # The writer may have finished between the SELECT and the lock: only a
                    # reply still `generating` was cut off.
                    cur = self._db.execute(
                        "UPDATE messages SET status='interrupted' "
                        "WHERE id=? AND status='generating'",
                        (message_id,),
                    )
                    marked += cur.rowcount
            finally:
                lock.release()
                with contextlib.suppress(OSError):
                    Path(lock.lock_file).unlink()
        return marked

    # --- sessions ------------------------------------------------------------------------------

    def create_session(self, *, model: str, system: str | None = None) -> int:
        now = time.time()
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO sessions (created, updated, model, system) VALUES (?, ?, ?, ?)",
                (now, now, model, system),
            )
            return int(cur.lastrowid or 0)

    def session(self, session_id: int) -> StoredSession | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, model, system, title, created, updated FROM sessions WHERE id=?",
                (session_id,),
            ).fetchone()
        return StoredSession(*row) if row else None

    def sessions(self) -> list[StoredSession]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, model, system, title, created, updated FROM sessions "
                "ORDER BY updated DESC"
            ).fetchall()
        return [StoredSession(*r) for r in rows]

    def messages(self, session_id: int) -> list[StoredMessage]:
        with self._lock:
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
        """Append a message to a session; returns its id.

        With `status="generating"` this object holds the reply's file lock until
        `update_message` gives it a final status (or `close`), so that other processes opening
        the database leave the reply alone while it is written.
        """
        now = time.time()
        message_id = 0
        try:
            with self._write() as db:
                seq = db.execute(
                    "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE session_id=?",
                    (session_id,),
                ).fetchone()[0]
                cur = db.execute(
                    "INSERT INTO messages "
                    "(session_id, seq, role, content, status, created, updated) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (session_id, seq, role, content, status, now, now),
                )
                message_id = int(cur.lastrowid or 0)
                db.execute("UPDATE sessions SET updated=? WHERE id=?", (now, session_id))
                if role == "user":
                    title = content.strip().splitlines()[0][:80] if content.strip() else None
                    db.execute(
                        "UPDATE sessions SET title=? WHERE id=? AND title IS NULL",
                        (title, session_id),
                    )
                if status == "generating":
                    # Locked before the row is committed, so no other process ever sees this
                    # reply `generating` without its writer's lock held.
                    lock = self._reply_lock(message_id)
                    lock.acquire(timeout=BUSY_TIMEOUT_S)
                    self._reply_locks[message_id] = lock
        except BaseException:
            with self._lock:
                self._release_reply(message_id)  # a lock taken for a row never committed
            raise
        return message_id

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
        with self._lock:
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", args)
            # The final status is committed before the lock goes, so a reader that takes the
            # lock next finds the reply finished, not `generating`.
            if status is not None and status != "generating":
                self._release_reply(message_id)
