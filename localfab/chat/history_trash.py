"""Deleting a chat session so that it can be put back (undo): its rows, kept and restored.

A deleted session is kept as its rows (`DeletedSession`); restoring puts them back with their
ids where those are free, new ids where a newer session or message took them meanwhile, and the
versions' parent links mapped to the restored ids.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from localfab.errors import UsageError

SESSION_COLUMNS = "id, created, updated, model, system, title, leaf_id"
MESSAGE_COLUMNS = (
    "id, session_id, seq, role, content, status, continues, created, updated, parent_id, chosen, "
    "reasoning, tools, images"
)


@dataclass(frozen=True)
class DeletedSession:
    """A deleted session's rows, enough to put it back (undo)."""

    session: tuple[Any, ...]
    messages: tuple[tuple[Any, ...], ...]


def delete_rows(db: sqlite3.Connection, session_id: int, writing: Container[int]) -> DeletedSession:
    """Delete a session and its messages, inside a write transaction; returns its rows.

    `writing` holds the ids of replies still being written: their session is not deleted.
    """
    session = db.execute(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id=?", (session_id,)
    ).fetchone()
    if session is None:
        raise UsageError(f"there is no chat session {session_id}")
    messages = db.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id=? ORDER BY seq",
        (session_id,),
    ).fetchall()
    if any(row[0] in writing for row in messages):
        raise UsageError("this chat is being written: stop its reply first")
    db.execute("DELETE FROM messages WHERE session_id=?", (session_id,))
    db.execute("DELETE FROM sessions WHERE id=?", (session_id,))
    return DeletedSession(tuple(session), tuple(tuple(m) for m in messages))


def restore_rows(db: sqlite3.Connection, deleted: DeletedSession) -> int:
    """Put a deleted session back, inside a write transaction; returns its id."""
    session = list(deleted.session)
    taken = db.execute("SELECT 1 FROM sessions WHERE id=?", (session[0],)).fetchone()
    if taken:
        cur = db.execute(
            "INSERT INTO sessions (created, updated, model, system, title) VALUES (?, ?, ?, ?, ?)",
            session[1:6],
        )
        session_id = int(cur.lastrowid or 0)
    else:
        db.execute(
            f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL)",
            session[:6],
        )
        session_id = int(session[0])
    ids: dict[int, int] = {}  # old id -> restored id (parents come before children)
    marks = ", ".join("?" * len(MESSAGE_COLUMNS.split(",")))
    for row in deleted.messages:
        message = list(row)
        old_id = int(message[0])
        message[1] = session_id
        if message[9] is not None:
            message[9] = ids.get(int(message[9]), message[9])
        if taken or db.execute("SELECT 1 FROM messages WHERE id=?", (old_id,)).fetchone():
            message[0] = None  # a new id; the message's place (seq) is kept
        cur = db.execute(f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES ({marks})", message)
        ids[old_id] = int(cur.lastrowid or old_id)
    leaf = session[6]
    db.execute(
        "UPDATE sessions SET leaf_id=? WHERE id=?",
        (None if leaf is None else ids.get(int(leaf), leaf), session_id),
    )
    return session_id
