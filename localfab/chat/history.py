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
Version 2 adds full-text search: an FTS5 index over the messages, kept in step by triggers.
Where SQLite lacks FTS5 the index is not built and `search` falls back to a LIKE scan.
Version 3 adds versions (branches): each message points at the message before it (`parent_id`),
so an edited prompt or a regenerated reply is a sibling of the message it replaces (same
parent) and nothing is ever overwritten. A session's current path runs from the root to its
`leaf_id`; `messages` returns that path. Switching to another version (`switch_to`) moves the
leaf to the newest-chosen path below it, so a branch comes back as it was left. Databases of
version 2 upgrade in place: each message's parent is the one before it, the leaf the last one.

Searches read through connections of their own, never the shared one: in WAL mode a reader and
the writer do not wait for each other, so a long search holds up neither the list of chats nor
a reply being saved, and a search nobody wants any more can be stopped mid-query.

The tables, row types and upgrade steps are in `history_schema`, search in `history_search`,
deleting and restoring a session's rows in `history_trash`.
Sessions also leave as Markdown or JSON (`chat.transfer.export_markdown`, `export_json`), and
that JSON comes back as a new session (`transfer.import_json`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from localfab.chat.history_images import ImageStore, named_images
from localfab.chat.history_locks import ReplyLocks, drop
from localfab.chat.history_schema import (
    ANCESTORS,
    PATH,
    SCHEMA_1,
    SCHEMA_VERSION,
    STORED_COLUMNS,
    StoredMessage,
    StoredSession,
    migrate,
)
from localfab.chat.history_search import (
    FTS_TABLE,
    HIT_END,
    HIT_START,
    MAX_QUERY_CHARS,
    MAX_TERMS,
    NO_FTS_NOTICE,
    SNIPPET_TOKENS,
    SearchCancelled,
    SearchHit,
    SearchPool,
    SearchTerms,
    like_snippet,
    search_fts,
    search_like,
    search_terms,
    split_hits,
)
from localfab.chat.history_trash import (
    MESSAGE_COLUMNS,
    SESSION_COLUMNS,
    DeletedSession,
    delete_rows,
    restore_rows,
)
from localfab.errors import UsageError

STATUSES = ("complete", "generating", "length", "interrupted")

# How long a writer waits for another process's write transaction before giving up. Writes are
# single small transactions, so any wait beyond a moment means a stuck process.
BUSY_TIMEOUT_S = 30.0

# A running search asks whether it is still wanted every this many SQLite VM steps: a few
# milliseconds apart, so a superseded search stops at once, at no measurable cost.
SEARCH_CHECK_STEPS = 1000
# Idle search connections kept open for the next search (each search takes one to itself).
SEARCH_CONNECTIONS_KEPT = 2


class History:
    """One SQLite database of chat sessions, safe to share between processes and threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Resolved, so that processes naming the database by different paths share the locks.
        real = path.resolve()
        self._real_path = real  # what searches open, wherever the working directory is by then
        self.locks_dir = real.with_name(real.name + ".writing")
        # The connection is shared by the threads of one process (a UI thread and a worker):
        # the lock keeps one thread's transaction from interleaving with another's statements.
        self._lock = threading.RLock()
        self._reply_locks = ReplyLocks(self.locks_dir)  # the replies this object writes
        # Connections searches read through, outside `_lock` (see `SearchPool`).
        self._searches = SearchPool(real, BUSY_TIMEOUT_S, SEARCH_CONNECTIONS_KEPT)
        self._db = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S
        )
        self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()
        self.full_text = self._has_table(FTS_TABLE)
        self.mark_interrupted()
        # The chats' images, beside the database; those of chats deleted before now go.
        self.images = ImageStore(real.with_name(real.name + ".images"))
        self.images.prune(named_images(self._db))

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
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

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The shared connection, to read from while no other thread uses it."""
        with self._lock:
            yield self._db

    def _migrate(self) -> None:
        migrate(self.write, self.schema_version)

    def _has_table(self, name: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
            ).fetchone()
        return row is not None

    @property
    def search_notice(self) -> str | None:
        """Why search is slower than it should be, or None when the full-text index is used."""
        return None if self.full_text else NO_FTS_NOTICE

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        """Close the database; replies this object was still writing are marked interrupted."""
        with self._lock:
            for message_id in self._reply_locks:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute(
                        "UPDATE messages SET status='interrupted' "
                        "WHERE id=? AND status='generating'",
                        (message_id,),
                    )
                self._reply_locks.release(message_id)
            self._db.close()
        self._searches.close()

    # --- replies being written -----------------------------------------------------------------

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
        marked = 0
        for (message_id,) in rows:
            # Not when its writer is alive (this object or another), nor when the lock folder
            # cannot be written (then nobody can tell): the reply is left be.
            lock = self._reply_locks.cut_off(message_id)
            if lock is None:
                continue
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
                drop(lock)
        return marked

    # --- sessions ------------------------------------------------------------------------------

    def create_session(self, *, model: str, system: str | None = None) -> int:
        now = time.time()
        with self.write() as db:
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
        """The session's current path, first message first (one version of each place)."""
        with self._lock:
            rows = self._db.execute(
                f"{PATH}SELECT {STORED_COLUMNS} FROM path JOIN messages m ON m.id=path.id "
                "ORDER BY path.depth DESC",
                (session_id,),
            ).fetchall()
        return [StoredMessage(*r) for r in rows]

    def all_messages(self, session_id: int) -> list[StoredMessage]:
        """Every message of the session, every version, in the order they were written."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {STORED_COLUMNS} FROM messages m WHERE m.session_id=? ORDER BY m.seq",
                (session_id,),
            ).fetchall()
        return [StoredMessage(*r) for r in rows]

    def siblings(self, message_id: int) -> list[StoredMessage]:
        """The versions of a message's place (itself included), oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {STORED_COLUMNS} FROM messages m JOIN messages o "
                "ON o.id=? AND m.session_id=o.session_id AND m.parent_id IS o.parent_id "
                "ORDER BY m.seq",
                (message_id,),
            ).fetchall()
        if not rows:
            raise UsageError(f"there is no chat message {message_id}")
        return [StoredMessage(*r) for r in rows]

    def switch_to(self, message_id: int) -> int:
        """Make the session's current path go through `message_id`; returns its session id.

        Below the message, the path follows the versions chosen last, so a branch left earlier
        comes back as it was.
        """
        with self.write() as db:
            row = db.execute("SELECT session_id FROM messages WHERE id=?", (message_id,)).fetchone()
            if row is None:
                raise UsageError(f"there is no chat message {message_id}: reopen the chat")
            session_id = int(row[0])
            now = time.time()
            db.execute(
                f"UPDATE messages SET chosen=? WHERE id IN ({ANCESTORS}SELECT id FROM up)",
                (now, message_id),
            )
            leaf = message_id
            while child := db.execute(
                "SELECT id FROM messages WHERE parent_id=? AND session_id=? "
                "ORDER BY chosen DESC, seq DESC LIMIT 1",
                (leaf, session_id),
            ).fetchone():
                leaf = int(child[0])
            db.execute(
                "UPDATE sessions SET leaf_id=?, updated=? WHERE id=?", (leaf, now, session_id)
            )
        return session_id

    # --- messages ------------------------------------------------------------------------------

    def add_message(
        self,
        session_id: int,
        role: str,
        content: str,
        *,
        status: str = "complete",
        sibling_of: int | None = None,
        tools: str = "",
        images: str = "",
    ) -> int:
        """Append a message to the session's current path; returns its id (`images`: JSON).

        With `sibling_of`, the message is a new version of that message instead (the same
        parent), and the current path moves to it; the old version stays.

        With `status="generating"` this object holds the reply's file lock until
        `update_message` gives it a final status (or `close`), so that other processes opening
        the database leave the reply alone while it is written.
        """
        now = time.time()
        message_id = 0
        try:
            with self.write() as db:
                seq = db.execute(
                    "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE session_id=?",
                    (session_id,),
                ).fetchone()[0]
                parent = self._parent_for(db, session_id, sibling_of)
                cur = db.execute(
                    "INSERT INTO messages (session_id, seq, role, content, status, created, "
                    "updated, parent_id, chosen, tools, images) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, seq, role, content, status, now, now, parent, now, tools, images),
                )
                message_id = int(cur.lastrowid or 0)
                db.execute(
                    "UPDATE sessions SET updated=?, leaf_id=? WHERE id=?",
                    (now, message_id, session_id),
                )
                if role == "user":
                    title = content.strip().splitlines()[0][:80] if content.strip() else None
                    db.execute(
                        "UPDATE sessions SET title=? WHERE id=? AND title IS NULL",
                        (title, session_id),
                    )
                if status == "generating":
                    # Locked before the row is committed, so no other process ever sees this
                    # reply `generating` without its writer's lock held.
                    self._reply_locks.hold(message_id, BUSY_TIMEOUT_S)
        except BaseException:
            with self._lock:
                self._reply_locks.release(message_id)  # taken for a row never committed
            raise
        return message_id

    @staticmethod
    def _parent_for(db: sqlite3.Connection, session_id: int, sibling_of: int | None) -> int | None:
        """The parent of a new message: the current leaf, or the parent of `sibling_of`."""
        if sibling_of is None:
            row = db.execute("SELECT leaf_id FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise UsageError(f"there is no chat session {session_id}")
            return None if row[0] is None else int(row[0])
        row = db.execute(
            "SELECT parent_id FROM messages WHERE id=? AND session_id=?", (sibling_of, session_id)
        ).fetchone()
        if row is None:
            raise UsageError(
                f"message {sibling_of} is not in chat session {session_id}: reopen the chat"
            )
        return None if row[0] is None else int(row[0])

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        status: str | None = None,
        continues: int | None = None,
        reasoning: str | None = None,
        tools: str | None = None,
    ) -> None:
        sets, args = ["content=?", "updated=?"], [content, time.time()]
        if reasoning is not None:
            sets.append("reasoning=?")
            args.append(reasoning)
        if tools is not None:
            sets.append("tools=?")
            args.append(tools)
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
                self._reply_locks.release(message_id)

    # --- renaming, deleting and restoring sessions ------------------------------------------------

    def rename_session(self, session_id: int, title: str) -> None:
        """Give a session a new title (trimmed, at most 80 characters)."""
        title = title.strip()[:80]
        if not title:
            raise UsageError("a chat's title cannot be empty")
        with self.write() as db:
            cur = db.execute(
                "UPDATE sessions SET title=?, updated=? WHERE id=?",
                (title, time.time(), session_id),
            )
            if cur.rowcount == 0:
                raise UsageError(f"there is no chat session {session_id}")

    def delete_session(self, session_id: int) -> DeletedSession:
        """Delete a session and its messages; returns what `restore_session` needs to undo it."""
        with self.write() as db:
            return delete_rows(db, session_id, self._reply_locks)

    def restore_session(self, deleted: DeletedSession) -> int:
        """Put a deleted session back; returns its id.

        It keeps its id unless a newer session took it meanwhile; then it gets a new one.
        """
        with self.write() as db:
            return restore_rows(db, deleted)

    # --- search --------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        limit: int = 50,
        *,
        cancelled: Callable[[], bool] | None = None,
        thoughts: bool = False,
    ) -> list[SearchHit]:
        """Messages holding every word of `query` (the last one as a prefix), best first;
        with `thoughts`, then replies whose thought holds them (role "thought").

        Uses the FTS5 index (ranked by bm25); without FTS5, a LIKE scan, newest first. Each hit
        has a snippet with the matches between `HIT_START` and `HIT_END`. The query is bounded
        by `search_terms`; one that can match nothing (a lone surrogate) finds nothing.

        The search reads through a connection of its own, so it holds up no other call. While it
        runs it calls `cancelled` every few milliseconds (on this thread); once that returns
        True the query stops and `SearchCancelled` is raised.
        """
        terms = search_terms(query)
        if not terms.words or limit <= 0:
            return []
        with self._searches.connection(cancelled, SEARCH_CHECK_STEPS) as db:
            try:
                if self.full_text:
                    hits = search_fts(db, terms, limit)
                else:
                    hits = search_like(db, terms, limit)
                if thoughts and len(hits) < limit:
                    found = {h.message_id for h in hits}
                    more = search_like(db, terms, limit, column="reasoning")
                    hits += [replace(h, role="thought") for h in more if h.message_id not in found]
                return hits[:limit]
            except sqlite3.OperationalError as exc:
                if cancelled is not None and cancelled():
                    raise SearchCancelled from exc
                raise


__all__ = [
    "SCHEMA_1",
    "SCHEMA_VERSION",
    "FTS_TABLE",
    "HIT_END",
    "HIT_START",
    "MAX_QUERY_CHARS",
    "MAX_TERMS",
    "MESSAGE_COLUMNS",
    "SESSION_COLUMNS",
    "SNIPPET_TOKENS",
    "DeletedSession",
    "History",
    "SearchCancelled",
    "SearchHit",
    "SearchTerms",
    "StoredMessage",
    "StoredSession",
    "like_snippet",
    "search_terms",
    "split_hits",
]
