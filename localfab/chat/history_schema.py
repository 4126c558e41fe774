"""The chat history's tables: the first schema and the steps that upgrade it, the rows as
`History` returns them, and the SQL that walks a session's tree of versions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from localfab.chat.history_search import FTS_TABLE

SCHEMA_1 = """
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
    """


def has_fts5(db: sqlite3.Connection) -> bool:
    """Whether this SQLite was built with FTS5."""
    try:
        db.execute("CREATE VIRTUAL TABLE temp.localfab_fts5_probe USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    db.execute("DROP TABLE temp.localfab_fts5_probe")
    return True


def build_full_text(db: sqlite3.Connection) -> None:
    """An external-content FTS5 index over messages.content, kept in step by triggers and
    filled for the rows already there (schema 2, where SQLite has FTS5)."""
    db.execute(
        f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5("
        "content, content='messages', content_rowid='id', tokenize='unicode61')"
    )
    db.execute(
        f"CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN "
        f"INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute(
        f"CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN "
        f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) "
        f"VALUES ('delete', old.id, old.content); END"
    )
    db.execute(
        f"CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN "
        f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) "
        f"VALUES ('delete', old.id, old.content); "
        f"INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')")


def add_versions(db: sqlite3.Connection) -> None:
    """Schema 3: messages form a tree (parent_id), a session has a current leaf.

    Existing sessions become one path each: every message's parent is the message before it
    (by seq), and the last message is the leaf. `chosen` orders siblings when the path below a
    message is picked again (the newest chosen wins).
    """
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
    db.execute("ALTER TABLE messages ADD COLUMN chosen REAL")
    db.execute("ALTER TABLE sessions ADD COLUMN leaf_id INTEGER")
    db.execute(
        "UPDATE messages SET chosen=created, parent_id=(SELECT p.id FROM messages p "
        "WHERE p.session_id=messages.session_id AND p.seq<messages.seq ORDER BY p.seq DESC LIMIT 1)"
    )
    db.execute(
        "UPDATE sessions SET leaf_id=(SELECT m.id FROM messages m WHERE m.session_id=sessions.id "
        "ORDER BY m.seq DESC LIMIT 1)"
    )
    db.execute("CREATE INDEX messages_parent ON messages(parent_id, session_id, seq)")
    # A row written without versions in mind (by an older localfab sharing the database, or a
    # plain INSERT) has no `chosen`: it goes after the session's current path, as it would have.
    db.execute(
        "CREATE TRIGGER messages_link AFTER INSERT ON messages WHEN new.chosen IS NULL BEGIN "
        "UPDATE messages SET chosen=new.created, "
        "parent_id=(SELECT leaf_id FROM sessions WHERE id=new.session_id) WHERE id=new.id; "
        "UPDATE sessions SET leaf_id=new.id WHERE id=new.session_id; END"
    )


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str
    status: str
    continues: int
    parent_id: int | None = None
    version: int = 1  # this message's place among its siblings (versions), from 1
    versions: int = 1  # how many versions its place in the conversation has
    reasoning: str = ""  # a thinking model's thought before its answer (`content`)
    # Tool calling, as JSON ("" for plain text): an assistant message's calls
    # ({"calls": [{"id", "name", "arguments"}]}), or a tool message's call and outcome
    # ({"call_id", "name", "kind"}); see `localfab.chat.toolturns`.
    tools: str = ""
    images: str = ""  # the images of a user message, as JSON (`history_images.refs_json`)


# A message's columns as StoredMessage holds them (`m` is the messages table), with its version
# number and count from its siblings (the same parent in the same session).
STORED_COLUMNS = (
    "m.id, m.role, m.content, m.status, m.continues, m.parent_id, "
    "(SELECT COUNT(*) FROM messages s WHERE s.parent_id IS m.parent_id "
    "AND s.session_id=m.session_id AND s.seq<=m.seq), "
    "(SELECT COUNT(*) FROM messages s WHERE s.parent_id IS m.parent_id "
    "AND s.session_id=m.session_id), m.reasoning, m.tools, m.images"
)
# The current path of session ?: (id, depth) from its leaf (depth 0) up to the root.
PATH = (
    "WITH RECURSIVE path(id, depth) AS ("
    "SELECT leaf_id, 0 FROM sessions WHERE id=? AND leaf_id IS NOT NULL "
    "UNION ALL SELECT p.parent_id, path.depth + 1 FROM messages p JOIN path ON p.id=path.id "
    "WHERE p.parent_id IS NOT NULL) "
)
# Message ? and every message above it.
ANCESTORS = (
    "WITH RECURSIVE up(id) AS (SELECT ? UNION ALL "
    "SELECT p.parent_id FROM messages p JOIN up ON p.id=up.id WHERE p.parent_id IS NOT NULL) "
)


@dataclass(frozen=True)
class StoredSession:
    id: int
    model: str
    system: str | None
    title: str | None
    created: float
    updated: float


def add_full_text(db: sqlite3.Connection) -> None:
    """Schema 2: an external-content FTS5 index over messages.content, filled for old rows.

    Without FTS5 nothing is created; search then scans with LIKE. (The probe is looked up in
    this module, where a test can stand in for an SQLite without FTS5.)
    """
    if not has_fts5(db):
        return
    build_full_text(db)


# Each entry moves the schema from version i to i + 1: statements separated by ";", or a
# function of the connection for a migration whose statements hold ";" themselves (triggers).
Migration = str | Callable[[sqlite3.Connection], None]
# Schema 4: a thinking model's reasoning, kept apart from the answer in `content`.
ADD_REASONING = "ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''"
# Schema 5: tool calls and results (JSON), beside the text in `content`.
ADD_TOOLS = "ALTER TABLE messages ADD COLUMN tools TEXT NOT NULL DEFAULT ''"
# Schema 6: the images a user message carried (JSON naming files of `history_images`).
ADD_IMAGES = "ALTER TABLE messages ADD COLUMN images TEXT NOT NULL DEFAULT ''"
MIGRATIONS: tuple[Migration, ...] = (
    SCHEMA_1,
    add_full_text,
    add_versions,
    ADD_REASONING,
    ADD_TOOLS,
    ADD_IMAGES,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(write: Callable[[], AbstractContextManager[sqlite3.Connection]], version: int) -> None:
    """Run the migrations from schema `version` on, each in its own write transaction."""
    for i in range(version, len(MIGRATIONS)):
        with write() as db:
            # Another process may have migrated while this one waited for the lock.
            if int(db.execute("PRAGMA user_version").fetchone()[0]) != i:
                continue
            migration = MIGRATIONS[i]
            if callable(migration):
                migration(db)
            else:
                for statement in migration.split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version={i + 1}")
