"""History: rename, delete and restore, full-text search (FTS5 and its LIKE fallback),
schema migration to version 2, and export/import of sessions."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import localfab.chat.history_schema as history_schema
from localfab.chat.history import (
    HIT_END,
    HIT_START,
    SCHEMA_1,
    SCHEMA_VERSION,
    History,
    split_hits,
)
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.errors import UsageError


def chat(history: History, *pairs: tuple[str, str], model: str = "m") -> int:
    sid = history.create_session(model=model, system="Be brief.")
    for user, reply in pairs:
        history.add_message(sid, "user", user)
        history.add_message(sid, "assistant", reply)
    return sid


@pytest.fixture
def history(tmp_path: Path) -> History:
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def test_new_database_has_full_text_index(history: History) -> None:
    assert history.schema_version == SCHEMA_VERSION
    assert history.full_text and history.search_notice is None


def test_search_finds_words_marks_them_and_names_the_session(history: History) -> None:
    a = chat(history, ("How do lighthouses work?", "A lamp and a Fresnel lens."))
    b = chat(history, ("Tell me about ships", "Ships float; lighthouses guide them."))
    hits = history.search("lighthouses")
    assert {(h.session_id, h.role) for h in hits} == {(a, "user"), (b, "assistant")}
    for hit in hits:
        assert f"{HIT_START}lighthouses{HIT_END}" in hit.snippet.lower()
        assert (
            history.messages(hit.session_id)[
                [m.id for m in history.messages(hit.session_id)].index(hit.message_id)
            ]
            .content.lower()
            .count("lighthouses")
            == 1
        )
    assert history.search("fresnel lens")[0].session_id == a
    assert history.search("fres")[0].session_id == a  # the last word is a prefix
    assert history.search("nothing-like-this") == []
    assert history.search('"unbalanced (quote AND') == []  # never FTS5 syntax errors


def test_index_follows_updates_and_deletes(history: History) -> None:
    sid = history.create_session(model="m")
    history.add_message(sid, "user", "hello")
    reply = history.add_message(sid, "assistant", "", status="generating")
    history.update_message(reply, "the quokka smiles", status="complete")
    assert [h.message_id for h in history.search("quokka")] == [reply]
    history.update_message(reply, "the wombat digs")
    assert history.search("quokka") == []
    assert [h.message_id for h in history.search("wombat")] == [reply]
    history.delete_session(sid)
    assert history.search("wombat") == []


def test_version_1_database_is_migrated_and_indexed(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.execute("INSERT INTO sessions VALUES (1, 1.0, 1.0, 'm', NULL, 'old chat')")
    db.execute(
        "INSERT INTO messages (session_id, seq, role, content, created, updated) "
        "VALUES (1, 0, 'user', 'an archaic albatross', 1.0, 1.0)"
    )
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    history = History(path)
    assert history.schema_version == SCHEMA_VERSION
    (hit,) = history.search("albatross")
    assert hit.session_id == 1 and hit.title == "old chat"
    history.close()


def test_like_fallback_without_fts5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_schema, "has_fts5", lambda db: False)
    history = History(tmp_path / "h.sqlite3")
    assert history.schema_version == SCHEMA_VERSION and not history.full_text
    assert "FTS5" in (history.search_notice or "")
    sid = chat(history, ("100% of the_cat", "a cat nap"))
    (hit,) = history.search("the_cat")
    assert hit.session_id == sid and f"{HIT_START}the_cat{HIT_END}" in hit.snippet
    assert history.search("100%") and not history.search("200%")
    assert [h.role for h in history.search("cat nap")] == ["assistant"]
    history.close()


def test_split_hits() -> None:
    text = f"a {HIT_START}b{HIT_END} c {HIT_START}d{HIT_END}"
    assert split_hits(text) == [("a ", False), ("b", True), (" c ", False), ("d", True)]


def test_rename_delete_restore(history: History) -> None:
    sid = chat(history, ("first", "one"), ("second", "two"))
    history.rename_session(sid, "  My chat  ")
    assert history.session(sid).title == "My chat"
    with pytest.raises(UsageError):
        history.rename_session(sid, "   ")
    before = history.messages(sid)
    deleted = history.delete_session(sid)
    assert history.session(sid) is None and history.messages(sid) == []
    assert history.search("second") == []
    assert history.restore_session(deleted) == sid
    assert history.messages(sid) == before and history.session(sid).title == "My chat"
    assert [h.session_id for h in history.search("second")] == [sid]
    with pytest.raises(UsageError):
        history.delete_session(12345)


def test_restore_after_the_id_was_reused(history: History) -> None:
    sid = chat(history, ("keep me", "kept"))
    before = [(m.role, m.content) for m in history.messages(sid)]
    deleted = history.delete_session(sid)
    other = chat(history, ("newer", "chat"))
    assert other == sid  # SQLite reuses the highest free id
    restored = history.restore_session(deleted)
    assert restored != other
    assert [(m.role, m.content) for m in history.messages(restored)] == before
    assert [m.content for m in history.messages(other)] == ["newer", "chat"]


def test_deleting_a_chat_being_written_is_refused(history: History) -> None:
    sid = history.create_session(model="m")
    history.add_message(sid, "user", "hi")
    reply = history.add_message(sid, "assistant", "", status="generating")
    with pytest.raises(UsageError, match="being written"):
        history.delete_session(sid)
    history.update_message(reply, "done", status="complete")


def test_json_round_trip(history: History) -> None:
    sid = chat(history, ("Write 中文 and `code`", "```py\nprint('hi')\n```"), model="gemma")
    history.add_message(sid, "user", "more")
    cut = history.add_message(sid, "assistant", "", status="generating")
    history.update_message(cut, "partial", status="length", continues=2)
    text = export_json(history, sid)
    assert json.loads(text)["format"] == "localfab-chat"
    new = import_json(history, text)
    assert new != sid
    fields = [(m.role, m.content, m.status, m.continues) for m in history.messages(sid)]
    assert [(m.role, m.content, m.status, m.continues) for m in history.messages(new)] == fields
    old, copy = history.session(sid), history.session(new)
    assert (copy.model, copy.system, copy.title) == (old.model, old.system, old.title)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", "invalid JSON"),
        ('{"format": "other"}', "not a localfab chat export"),
        ('{"format": "localfab-chat", "version": 9}', "update localfab"),
        (
            '{"format": "localfab-chat", "version": 1, "session": {}, '
            '"messages": [{"role": "robot", "content": "x"}]}',
            "message 1",
        ),
    ],
)
def test_import_rejects_bad_files_and_stores_nothing(
    history: History, text: str, words: str
) -> None:
    with pytest.raises(UsageError, match=words):
        import_json(history, text)
    assert history.sessions() == []


def test_markdown_export(history: History) -> None:
    sid = chat(history, ("Question?", "Answer."))
    history.rename_session(sid, "Q and A")
    md = export_markdown(history, sid)
    assert md.startswith("# Q and A\n")
    assert "## System\n\nBe brief." in md
    assert md.index("## You\n\nQuestion?") < md.index("## Assistant\n\nAnswer.")


@pytest.mark.parametrize("fts", [True, False], ids=["fts5", "like"])
def test_thoughts_are_searched_only_when_asked_and_survive_a_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fts: bool
) -> None:
    if not fts:
        monkeypatch.setattr(history_schema, "has_fts5", lambda db: False)
    history = History(tmp_path / "h.sqlite3")
    sid = chat(history, ("prime?", "yes, it is prime"))
    reply = history.messages(sid)[-1].id
    history.update_message(reply, "yes, it is prime", reasoning="no divisor up to its root")
    assert history.search("divisor") == []  # the answer, not the thought
    (hit,) = history.search("divisor", thoughts=True)
    assert (hit.message_id, hit.role) == (reply, "thought")
    assert "divisor" in hit.snippet
    # A message found in its answer is listed once, as itself.
    assert sorted(h.role for h in history.search("prime", thoughts=True)) == ["assistant", "user"]
    deleted = history.delete_session(sid)
    history.restore_session(deleted)
    assert history.messages(sid)[-1].reasoning == "no divisor up to its root"
    history.close()
