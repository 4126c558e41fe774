"""Message versions in the SQLite history: siblings, the current path, migration, export/import."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from localfab.chat import history_schema
from localfab.chat.history import (
    SCHEMA_1,
    SCHEMA_VERSION,
    History,
)
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.errors import UsageError


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def contents(history: History, session_id: int) -> list[str]:
    return [m.content for m in history.messages(session_id)]


def branched(history: History) -> tuple[int, dict[str, int]]:
    """q1 -> a1 -> q2 -> {a2, a2'} ; q1 also edited into q1' -> a1'."""
    sid = history.create_session(model="m")
    ids = {"q1": history.add_message(sid, "user", "q1")}
    ids["a1"] = history.add_message(sid, "assistant", "a1")
    ids["q2"] = history.add_message(sid, "user", "q2")
    ids["a2"] = history.add_message(sid, "assistant", "a2")
    ids["a2b"] = history.add_message(sid, "assistant", "a2 again", sibling_of=ids["a2"])
    ids["q1b"] = history.add_message(sid, "user", "q1 edited", sibling_of=ids["q1"])
    ids["a1b"] = history.add_message(sid, "assistant", "a1 for the edit")
    return sid, ids


def test_a_sibling_becomes_the_current_path_and_keeps_the_old_one(history: History) -> None:
    sid, ids = branched(history)
    assert contents(history, sid) == ["q1 edited", "a1 for the edit"]
    first = history.messages(sid)[0]
    assert (first.version, first.versions, first.parent_id) == (2, 2, None)
    assert len(history.all_messages(sid)) == 7  # nothing was deleted
    assert [m.id for m in history.siblings(ids["a2"])] == [ids["a2"], ids["a2b"]]
    stored = history.session(sid)
    assert stored is not None and stored.title == "q1"  # the title comes from the first message


def test_switching_brings_a_branch_back_as_it_was_left(history: History) -> None:
    sid, ids = branched(history)
    assert history.switch_to(ids["q1"]) == sid
    # Below q1 the path follows the versions chosen last: the regenerated reply.
    assert contents(history, sid) == ["q1", "a1", "q2", "a2 again"]
    path = history.messages(sid)
    assert [(m.version, m.versions) for m in path] == [(1, 2), (1, 1), (1, 1), (2, 2)]
    history.switch_to(ids["a2"])
    assert contents(history, sid) == ["q1", "a1", "q2", "a2"]
    history.switch_to(ids["q1b"])
    history.switch_to(ids["q1"])
    assert contents(history, sid) == ["q1", "a1", "q2", "a2"]  # still the one chosen last
    # A new message goes after the current path's last one.
    new = history.add_message(sid, "user", "q3")
    assert history.messages(sid)[-1].id == new and history.messages(sid)[-1].parent_id == ids["a2"]


def test_bad_version_requests_say_what_to_do(history: History) -> None:
    sid, ids = branched(history)
    other = history.create_session(model="m")
    with pytest.raises(UsageError, match="reopen the chat"):
        history.add_message(other, "user", "x", sibling_of=ids["q1"])
    with pytest.raises(UsageError, match="no chat message"):
        history.switch_to(10_000)
    with pytest.raises(UsageError, match="no chat message"):
        history.siblings(10_000)
    assert contents(history, sid) == ["q1 edited", "a1 for the edit"]


def test_search_hit_in_another_version_opens_that_version(history: History) -> None:
    sid, ids = branched(history)
    (hit,) = history.search("again")
    assert hit.message_id == ids["a2b"]
    assert hit.message_id not in [m.id for m in history.messages(sid)]
    history.switch_to(hit.message_id)
    assert history.messages(sid)[-1].id == ids["a2b"]


def test_delete_and_undo_keep_every_version(history: History) -> None:
    sid, ids = branched(history)
    before = history.all_messages(sid)
    path = history.messages(sid)
    deleted = history.delete_session(sid)
    restored = history.restore_session(deleted)
    assert restored == sid
    assert history.all_messages(sid) == before and history.messages(sid) == path


def test_undo_after_the_ids_were_taken_relinks_the_versions(history: History) -> None:
    sid, ids = branched(history)
    path = [(m.role, m.content, m.version, m.versions) for m in history.messages(sid)]
    deleted = history.delete_session(sid)
    # A new chat takes the deleted session's id and some of its message ids.
    history._db.execute(
        "INSERT INTO sessions (id, created, updated, model) VALUES (?, 1, 1, 'x')", (sid,)
    )
    taker = history.create_session(model="x")
    for _ in range(3):
        history.add_message(taker, "user", "filler")
    restored = history.restore_session(deleted)
    assert restored != sid
    assert [(m.role, m.content, m.version, m.versions) for m in history.messages(restored)] == path
    history.switch_to(history.messages(restored)[0].id)
    old = [m for m in history.siblings(history.messages(restored)[0].id) if m.content == "q1"][0]
    history.switch_to(old.id)
    assert contents(history, restored) == ["q1", "a1", "q2", "a2 again"]


def test_json_export_keeps_every_version_and_the_current_path(history: History) -> None:
    sid, ids = branched(history)
    history.switch_to(ids["a2"])
    data = json.loads(export_json(history, sid))
    assert data["version"] == 2 and len(data["messages"]) == 7
    assert data["messages"][data["session"]["current"]]["content"] == "a2"
    new = import_json(history, json.dumps(data))
    assert contents(history, new) == ["q1", "a1", "q2", "a2"]
    assert len(history.all_messages(new)) == 7
    q1 = history.messages(new)[0]
    assert (q1.version, q1.versions) == (1, 2)
    history.switch_to(history.siblings(q1.id)[1].id)
    assert contents(history, new) == ["q1 edited", "a1 for the edit"]


def test_a_version_1_export_still_imports_as_one_path(history: History) -> None:
    old = {
        "format": "localfab-chat",
        "version": 1,
        "session": {"title": "old", "model": "m", "system": None},
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi", "status": "generating"},
            {"role": "user", "content": "bye"},
        ],
    }
    sid = import_json(history, json.dumps(old))
    assert contents(history, sid) == ["hello", "hi", "bye"]
    assert [m.status for m in history.messages(sid)] == ["complete", "interrupted", "complete"]
    assert history.add_message(sid, "assistant", "ok") == history.messages(sid)[-1].id


@pytest.mark.parametrize("parent", [5, -1, "0", True, 1])
def test_an_export_with_a_bad_parent_is_refused(history: History, parent: object) -> None:
    data = {
        "format": "localfab-chat",
        "version": 2,
        "session": {"model": "m"},
        "messages": [
            {"role": "user", "content": "a", "parent": None},
            {"role": "assistant", "content": "b", "parent": parent},
        ],
    }
    with pytest.raises(UsageError, match="message 2 .* parent"):
        import_json(history, json.dumps(data))
    assert history.sessions() == []  # nothing half-imported


def test_markdown_export_is_the_current_path_with_version_marks(history: History) -> None:
    sid, ids = branched(history)
    text = export_markdown(history, sid)
    assert "q1 edited" in text and "a2 again" not in text
    assert "## You (version 2 of 2)" in text


def version_2_database(path: Path) -> None:
    """A database as localfab wrote it before versions existed (schema 2)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(SCHEMA_1)
    history_schema.add_full_text(db)
    db.execute("INSERT INTO sessions VALUES (1, 1.0, 5.0, 'm', 'be brief', 'old chat')")
    db.execute("INSERT INTO sessions VALUES (2, 2.0, 6.0, 'm', NULL, 'other chat')")
    rows = [
        (1, 0, "user", "how tall is the lighthouse", "complete"),
        (2, 0, "user", "unrelated question", "complete"),
        (1, 1, "assistant", "forty metres", "complete"),
        (1, 2, "user", "and the keeper?", "complete"),
        (1, 3, "assistant", "a reply cut o", "interrupted"),
    ]
    for sid, seq, role, content, status in rows:
        db.execute(
            "INSERT INTO messages (session_id, seq, role, content, status, created, updated) "
            "VALUES (?, ?, ?, ?, ?, 1.0, 1.0)",
            (sid, seq, role, content, status),
        )
    db.execute("PRAGMA user_version=2")
    db.close()


def test_a_version_2_database_upgrades_in_place_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    version_2_database(path)
    history = History(path)
    try:
        assert history.schema_version == SCHEMA_VERSION == 6
        assert {m.tools for m in history.messages(1)} == {""}  # schema 5: no tool calls yet
        assert contents(history, 1) == [
            "how tall is the lighthouse",
            "forty metres",
            "and the keeper?",
            "a reply cut o",
        ]
        assert [m.status for m in history.messages(1)][-1] == "interrupted"
        assert contents(history, 2) == ["unrelated question"]
        assert all(m.versions == 1 for m in history.messages(1))
        # Schema 4: old replies have no thought; a new one keeps its own beside the answer.
        assert all(m.reasoning == "" for m in history.messages(1))
        history.update_message(history.messages(1)[1].id, "forty metres", reasoning="tall?")
        assert (history.messages(1)[1].content, history.messages(1)[1].reasoning) == (
            "forty metres",
            "tall?",
        )
        (hit,) = history.search("keeper")
        assert hit.session_id == 1
        # The old chat goes on, and gets versions like a new one.
        last = history.messages(1)[-1].id
        again = history.add_message(1, "assistant", "a whole reply", sibling_of=last)
        assert history.messages(1)[-1].id == again
        assert (history.messages(1)[-1].version, history.messages(1)[-1].versions) == (2, 2)
    finally:
        history.close()
    # Opening it again migrates nothing twice.
    reopened = History(path)
    assert reopened.schema_version == SCHEMA_VERSION and len(reopened.all_messages(1)) == 5
    reopened.close()


def test_rows_written_without_versions_join_the_current_path(history: History) -> None:
    """An older localfab sharing the database, or a plain INSERT, appends as it always did."""
    sid = history.create_session(model="m")
    first = history.add_message(sid, "user", "versioned")
    for seq, role in ((1, "assistant"), (2, "user")):
        history._db.execute(
            "INSERT INTO messages (session_id, seq, role, content, status, created, updated) "
            "VALUES (?, ?, ?, ?, 'complete', 1.0, 1.0)",
            (sid, seq, role, f"plain {seq}"),
        )
    assert contents(history, sid) == ["versioned", "plain 1", "plain 2"]
    assert history.messages(sid)[1].parent_id == first
    reply = history.add_message(sid, "assistant", "versioned again")
    assert history.messages(sid)[-1].id == reply
