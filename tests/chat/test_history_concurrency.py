"""The chat history shared by several processes: no lost messages, no reply wrongly cut off."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from localfab.chat.history import SCHEMA_VERSION, History


def seqs(db: Path, session_id: int) -> list[int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT seq FROM messages WHERE session_id=? ORDER BY seq", (session_id,)
        ).fetchall()
    return [r[0] for r in rows]


def wait_for(path: Path, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


# --- two writers, one session --------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from localfab.chat.history import History
    db, session, name, n, go = sys.argv[1:]
    h = History(Path(db))
    Path(f"{db}.{name}.ready").touch()
    while not Path(go).exists():
        time.sleep(0.001)
    for i in range(int(n)):
        h.add_message(int(session), "user" if i % 2 else "assistant", f"{name} {i}")
    h.close()
    """
)


def test_two_processes_writing_one_session_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sessions.sqlite3"
    history = History(db)
    session = history.create_session(model="m")
    go = tmp_path / "go"
    n = 1000
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), str(session), name, str(n), str(go)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for name in ("a", "b"):
        wait_for(Path(f"{db}.{name}.ready"))
    go.touch()  # both start writing at once
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    stored = history.messages(session)
    assert len(stored) == 2 * n
    assert {m.content for m in stored} == {f"{w} {i}" for w in "ab" for i in range(n)}
    # each writer's messages stay in its own order, and seq is unique and gapless
    for w in "ab":
        mine = [int(m.content.split()[1]) for m in stored if m.content.startswith(w)]
        assert mine == list(range(n))
    assert seqs(db, session) == list(range(2 * n))
    history.close()


_OPENER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from localfab.chat.history import History
    db, go, name = sys.argv[1:]
    Path(f"{db}.{name}.ready").touch()
    while not Path(go).exists():
        time.sleep(0.001)
    h = History(Path(db))
    h.add_message(h.create_session(model="m"), "user", "hello")
    h.close()
    """
)


def test_processes_creating_the_database_at_once_all_succeed(tmp_path: Path) -> None:
    """Four processes open a new, empty database together: each must see the schema made once.

    The test holds SQLite's write lock while they start, so that all of them find the schema
    missing and queue up to create it; the one second of waiting only makes that likelier,
    the outcome asserted does not depend on it.
    """
    db = tmp_path / "new.sqlite3"
    go = tmp_path / "go"
    gate = sqlite3.connect(db, isolation_level=None)
    gate.execute("PRAGMA journal_mode=WAL")
    gate.execute("BEGIN IMMEDIATE")
    go.touch()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, str(db), str(go), str(i)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for i in range(4):
            wait_for(Path(f"{db}.{i}.ready"))
        time.sleep(1.0)
    finally:
        gate.execute("COMMIT")
        gate.close()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    history = History(db)
    assert history.schema_version == SCHEMA_VERSION and len(history.sessions()) == 4
    history.close()


def test_threads_sharing_one_history_lose_nothing(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3")
    session = history.create_session(model="m")
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            for i in range(300):
                history.add_message(session, "user", f"{name} {i}")
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(name,)) for name in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(history.messages(session)) == 900
    assert seqs(history.path, session) == list(range(900))
    history.close()


# --- a reply being written by another process ----------------------------------------------------

_REPLIER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from localfab.chat.history import History
    h = History(Path(sys.argv[1]))
    s = h.create_session(model="m")
    h.add_message(s, "user", "Tell me about lighthouses.")
    reply = h.add_message(s, "assistant", "Lighthouses are", status="generating")
    print(s, reply, flush=True)
    if sys.stdin.readline().strip() == "finish":
        h.update_message(reply, "Lighthouses are tall.", status="complete")
        print("done", flush=True)
        sys.stdin.readline()
    """
)


def start_replier(db: Path) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLIER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the reply is stored and being written
    assert line, proc.stderr.read() if proc.stderr else ""
    session, reply = map(int, line.split())
    return proc, session, reply


def status_of(history: History, session: int, reply: int) -> str:
    return next(m.status for m in history.messages(session) if m.id == reply)


def test_opening_the_database_leaves_a_live_reply_alone(tmp_path: Path) -> None:
    db = tmp_path / "sessions.sqlite3"
    proc, session, reply = start_replier(db)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        reader = History(db)  # a second process merely opens the database
        assert status_of(reader, session, reply) == "generating"
        again = History(db)
        assert again.mark_interrupted() == 0  # and again: still alive
        again.close()
        proc.stdin.write("finish\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        assert status_of(reader, session, reply) == "complete"
        assert [m.content for m in reader.messages(session)][-1] == "Lighthouses are tall."
        reader.close()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    # the writer left no lock file behind for its finished reply
    assert not list((tmp_path / "sessions.sqlite3.writing").glob("*.lock"))


def test_a_killed_writers_reply_is_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "sessions.sqlite3"
    proc, session, reply = start_replier(db)
    proc.kill()  # SIGKILL: no finally, no close, the lock dies with the process
    proc.communicate(timeout=30)
    history = History(db)
    assert status_of(history, session, reply) == "interrupted"
    assert [m.content for m in history.messages(session)] == [
        "Tell me about lighthouses.",
        "Lighthouses are",
    ]
    history.close()


def test_a_second_history_in_the_same_process_leaves_the_reply_alone(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    writer = History(db)
    session = writer.create_session(model="m")
    reply = writer.add_message(session, "assistant", "", status="generating")
    reader = History(db)
    assert status_of(reader, session, reply) == "generating"
    writer.update_message(reply, "done", status="length")
    assert status_of(reader, session, reply) == "length"
    # a reply its writer closed without finishing is cut off, for whoever opens next
    other = writer.add_message(session, "assistant", "half", status="generating")
    writer.close()
    later = History(db)
    assert later.messages(session)[-1].status == "interrupted"
    later.close()
    assert status_of(reader, session, other) == "interrupted"
    reader.close()


@pytest.mark.parametrize("final", ["complete", "length", "interrupted"])
def test_the_final_status_is_kept_when_a_reader_opens_after(tmp_path: Path, final: str) -> None:
    db = tmp_path / "h.sqlite3"
    writer = History(db)
    session = writer.create_session(model="m")
    reply = writer.add_message(session, "assistant", "", status="generating")
    writer.update_message(reply, "text", status=final)
    reader = History(db)
    assert reader.messages(session)[0].status == final
    reader.close()
    writer.close()


def test_a_reader_naming_the_database_by_another_path_sees_the_live_reply(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    db = tmp_path / "real" / "h.sqlite3"
    writer = History(db)
    session = writer.create_session(model="m")
    reply = writer.add_message(session, "assistant", "", status="generating")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    reader = History(tmp_path / "link" / "h.sqlite3")
    assert status_of(reader, session, reply) == "generating"
    reader.close()
    writer.close()
