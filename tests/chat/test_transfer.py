"""Hostile chat exports: every one is refused or clamped with a clear message, nothing is stored
half-way, the app stays alive, and a chat imported with an impossible time exports again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.chat.transfer import LATEST_TIME, export_markdown, import_json
from localfab.errors import UsageError
from localfab.tui.app import LocalfabApp
from tests.tui.test_sessions import answer_dialog
from tests.tui_support import build_app, loaded, wait_for


def export(**message: Any) -> str:
    """A valid export of one user message, with `message`'s fields replacing its own."""
    data = {
        "format": "localfab-chat",
        "version": 2,
        "session": {"title": "t", "model": "m", "created": 1_700_000_000.0, "current": 0},
        "messages": [{"parent": None, "role": "user", "content": "hello"} | message],
    }
    return json.dumps(data)


# Refused whole: a notice says why and nothing is stored.
REFUSED = {
    "lone surrogate": (export(content="a \ud800 b"), "not valid Unicode"),
    "lone surrogate in the title": (
        export().replace('"title": "t"', '"title": "\\ud800"'),
        "not valid Unicode",
    ),
    "100k nested arrays": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "5,000-digit number": ('{"format": ' + "9" * 5000 + "}", "not a localfab chat export"),
}
# Stored, with the number clamped or replaced.
CLAMPED = {
    "continues 2**64": export(continues=2**64),
    "created NaN": export(created=float("nan")),
    "created 1e308": export(created=1e308),
    "created Infinity": export(created=float("inf")),
    "created before 1970": export(created=-5.0),
    "session created 1e308": export().replace('"created": 1700000000.0', '"created": 1e308'),
    "session created Infinity": export().replace('"created": 1700000000.0', '"created": Infinity'),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_hostile_export_is_refused_whole(case: str, history: History) -> None:
    """Refused: text that is not Unicode, JSON too deep or a number too long for Python to read
    is a `UsageError` that says why (they were UnicodeEncodeError, RecursionError, ValueError)."""
    text, why = REFUSED[case]
    with pytest.raises(UsageError, match=why):
        import_json(history, text)
    assert history.sessions() == []


@pytest.mark.parametrize("case", list(CLAMPED))
def test_out_of_range_numbers_are_clamped(case: str, history: History) -> None:
    """Clamped: a time no calendar holds takes the import's time and continues is bounded (they
    were OverflowError and IntegrityError, or a stored 1e308 that export could not show)."""
    sid = import_json(history, CLAMPED[case])
    (session,) = history.sessions()
    assert 0 <= session.created <= LATEST_TIME
    (message,) = history.messages(sid)
    assert message.continues <= 10_000
    with history._lock:
        created, updated = history._db.execute(
            "SELECT created, updated FROM messages WHERE id = ?", (message.id,)
        ).fetchone()
    assert 0 <= created <= LATEST_TIME and 0 <= updated <= LATEST_TIME
    assert export_markdown(history, sid).startswith("# t")


def test_a_chat_stored_with_an_impossible_time_exports_as_markdown(history: History) -> None:
    """Stored by an older import: the Markdown export says the time is unknown."""
    sid = import_json(history, export())
    with history.write() as db:
        db.execute("UPDATE sessions SET created = 1e308 WHERE id = ?", (sid,))
    assert "- Started: unknown" in export_markdown(history, sid)


async def new_notice(pilot: Pilot[None], app: LocalfabApp, seen: set[str]) -> str:
    """The text of the first notification not in `seen` (earlier ones may have expired)."""
    fresh: list[str] = []

    def arrived() -> bool:
        fresh[:] = [str(n.message) for n in app._notifications if n.identity not in seen]
        return bool(fresh)

    await wait_for(pilot, arrived)
    return fresh[0]


@pytest.mark.anyio
async def test_the_app_imports_every_hostile_file_with_a_notice_and_stays_alive(
    history: History, tmp_path: Path
) -> None:
    files = {**{k: v[0] for k, v in REFUSED.items()}, **CLAMPED}
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot, app)
        for i, (case, text) in enumerate(files.items()):
            path = tmp_path / f"hostile-{i}.json"
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            seen = {n.identity for n in app._notifications}
            await app.run_action("screen.import_chat")
            await answer_dialog(pilot, app, str(path))
            note = await new_notice(pilot, app, seen)
            if case in REFUSED:
                assert REFUSED[case][1] in note, (case, note)
            else:
                assert "Chat imported" in note, (case, note)
        assert app.is_running
        # Each clamped file is one chat; the refused ones stored nothing.
        assert len(history.sessions()) == len(CLAMPED)
        # ... and each exports as Markdown.
        for session in history.sessions():
            out = tmp_path / f"out-{session.id}.md"
            seen = {n.identity for n in app._notifications}
            await app.run_action(f"screen.export_chat({session.id})")
            await answer_dialog(pilot, app, str(out))
            await new_notice(pilot, app, seen)
            assert out.read_text(encoding="utf-8").startswith("# t")
        assert app.is_running


def test_a_crash_of_the_app_exits_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app crashes (here its mount raises): Textual prints the traceback and sets return
    code 1, which the process now exits with (it exited 0)."""
    from textual.app import App

    from localfab.commands.chat import open_app
    from localfab.tui.app import LocalfabApp

    def crash(self: LocalfabApp) -> None:
        raise RuntimeError("a crash inside the app")

    def headless_run(self: LocalfabApp) -> None:
        App.run(self, headless=True)

    monkeypatch.setenv("LOCALFAB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(LocalfabApp, "on_mount", crash)
    monkeypatch.setattr(LocalfabApp, "run", headless_run)
    with pytest.raises(SystemExit) as ended:
        open_app(None)
    assert ended.value.code == 1


@pytest.mark.anyio
async def test_a_store_failure_during_an_import_is_a_notice_and_stores_nothing(
    history: History, tmp_path: Path
) -> None:
    """The database refuses the second message (a trigger stands in for a full disk or a broken
    file): the app says so, stays alive, and the import's one transaction stored nothing."""
    data = json.loads(export())
    data["messages"].append({"parent": 0, "role": "assistant", "content": "hi"})
    path = tmp_path / "two.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with history._lock:
        history._db.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.seq = 1 "
            "BEGIN SELECT RAISE(ABORT, 'the disk said no'); END"
        )
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot, app)
        seen = {n.identity for n in app._notifications}
        await app.run_action("screen.import_chat")
        await answer_dialog(pilot, app, str(path))
        note = await new_notice(pilot, app, seen)
        assert "nothing was stored" in note and "the disk said no" in note
        assert app.is_running
    assert history.sessions() == []
    with history._lock:
        assert history._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


@pytest.mark.anyio
async def test_the_app_exports_a_chat_stored_with_an_impossible_time(
    history: History, tmp_path: Path
) -> None:
    """A chat an older import stored with `created` 1e308: Markdown says 'unknown' (the export
    ended the app in time.localtime)."""
    sid = import_json(history, export())
    with history.write() as db:
        db.execute("UPDATE sessions SET created = 1e308 WHERE id = ?", (sid,))
    out = tmp_path / "out.md"
    app, _ = build_app(history)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot, app)
        seen = {n.identity for n in app._notifications}
        await app.run_action(f"screen.export_chat({sid})")
        await answer_dialog(pilot, app, str(out))
        assert "Chat exported" in await new_notice(pilot, app, seen)
        assert app.is_running
    assert "- Started: unknown" in out.read_text(encoding="utf-8")
