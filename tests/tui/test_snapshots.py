"""How the chat screen looks: pytest-textual-snapshot at 100x30 and 80x24, dark and light.

Deterministic: a stored chat on the fake engine, a fixed clock for the sessions panel, no cursor
blink. Update the stored SVGs with `pytest tests/tui/test_snapshots.py --snapshot-update` after
looking at them (`snapshot_report.html`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from localfab.chat.history import History
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.widgets.prompt import PromptBox
from tests.fake_engine import SAMPLE_REPLY
from tests.tui_models_support import FakeModels
from tests.tui_support import FIXED_NOW, build_app, wait_for

SIZES = [(100, 30), (80, 24)]
THEMES = ["localfab-dark", "localfab-light"]


def stored_chat(path: Path) -> tuple[History, int]:
    """A history with two older chats and one to resume, at fixed times."""
    history = History(path)
    for i, title in enumerate(["Plan a trip to Lisbon", "Explain KV cache quantization"]):
        sid = history.create_session(model="gemma3:270m")
        history.add_message(sid, "user", title)
        history.add_message(sid, "assistant", "An older answer.")
        dated(history, sid, FIXED_NOW - 86400 * (3 - i), FIXED_NOW - 86400 * (3 - i))
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "Compare two small models, with code")
    history.add_message(sid, "assistant", SAMPLE_REPLY)
    history.add_message(sid, "user", "And in one line?")
    history.add_message(sid, "assistant", "Smaller models are faster but", status="length")
    dated(history, sid, FIXED_NOW - 300, FIXED_NOW - 60)
    return history, sid


def dated(history: History, sid: int, created: float, updated: float) -> None:
    """Session `sid` as created and last updated at fixed times (the panel shows them)."""
    history._db.execute(
        "UPDATE sessions SET created=?, updated=? WHERE id=?", (created, updated, sid)
    )


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chat_screen(snap_compare, tmp_path, size, theme):
    history, sid = stored_chat(tmp_path / "sessions.sqlite3")
    assert snap_chat(snap_compare, history, sid, size, theme)


def snap_chat(
    snap_compare: Callable[..., bool],
    history: History,
    sid: int,
    size: tuple[int, int],
    theme: str,
    then: Callable[[LocalfabApp, Pilot[None]], Awaitable[None]] | None = None,
) -> bool:
    """The chat screen on stored chat `sid`, once loaded (and `then` has acted), compared."""
    app, _ = build_app(history, session_id=sid, theme=theme, clock_now=FIXED_NOW)

    async def ready(pilot: Pilot[None]) -> None:
        await wait_for(pilot, lambda: bool(app.screen_stack) and app.chat.loaded)
        if then is not None:
            await then(app, pilot)
        box = app.chat.query_one(PromptBox)
        box.focus()
        box.cursor_blink = False
        await pilot.pause()

    same = snap_compare(app, terminal_size=size, run_before=ready)
    history.close()
    return bool(same)


def thinking_chat(path: Path) -> tuple[History, int]:
    """A chat with a thinking model: two replies with their thoughts."""
    history = History(path)
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "Is 2027 a prime number?")
    first = history.add_message(sid, "assistant", "Yes: **2027** is prime.")
    thought = (
        "Check the primes up to its square root, 45.\nIt is odd, its digit sum is 11, it "
        "does not end in 5.\n7 · 289 = 2023, 11 · 184 = 2024, 13 · 155 = 2015 …\nNo divisor."
    )
    history.update_message(first, "Yes: **2027** is prime.", reasoning=thought)
    history.add_message(sid, "user", "And 2028?")
    second = history.add_message(sid, "assistant", "No: it is even (2 · 1014).")
    history.update_message(second, "No: it is even (2 · 1014).", reasoning="It ends in 8.")
    dated(history, sid, FIXED_NOW - 300, FIXED_NOW - 60)
    return history, sid


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chat_with_thoughts(snap_compare, tmp_path, size, theme):
    """The first reply's thought unfolded (from its block), the last one's folded."""
    history, sid = thinking_chat(tmp_path / "sessions.sqlite3")

    async def unfold_first(app: LocalfabApp, pilot: Pilot[None]) -> None:
        from localfab.tui.widgets.thought import ThoughtBlock

        await wait_for(pilot, lambda: len(app.chat.query(ThoughtBlock)) == 2)
        app.chat.query(ThoughtBlock).first().action_fold()

    assert snap_chat(snap_compare, history, sid, size, theme, unfold_first)


@pytest.mark.parametrize("theme", THEMES)
def test_load_failure_dialog(snap_compare, tmp_path, theme):
    history = History(tmp_path / "sessions.sqlite3")
    reason = (
        "/models/fake-model.gguf is truncated (120.0 of 241.4 MB): download it again with "
        "`localfab pull fake-model`"
    )
    app, _ = build_app(history, fail=reason, theme=theme, clock_now=FIXED_NOW)

    async def failed(pilot):
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ErrorDialog")
        app.chat.query_one(PromptBox).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=failed)
    history.close()


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_models_screen(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    """The local list alone, from a source that offers no catalog (its tab is disabled)."""
    from tests.tui.test_models import Models

    history = History(tmp_path / "sessions.sqlite3")
    app = make_app(AppDeps(backend=None, history=history, models=Models(), theme=theme))

    async def listed(pilot: Pilot[None]) -> None:
        await models_listed(pilot)

    assert snap_compare(app, terminal_size=size, run_before=listed)
    history.close()


# the models screen with the catalog and downloads (tests/tui_models_support.py) ---------------
def models_app_for_snapshot(tmp_path: Path, theme: str) -> tuple[LocalfabApp, FakeModels, History]:
    fake = FakeModels()
    history = History(tmp_path / "sessions.sqlite3")
    return make_app(AppDeps(backend=None, history=history, models=fake, theme=theme)), fake, history


async def models_listed(pilot: Pilot[None]) -> None:
    def ready() -> bool:
        tables = pilot.app.screen.query("#models-table").results(DataTable)
        table = next(iter(tables), None)
        if table is None or table.row_count < 2:
            return False
        return str(table.get_cell("big", "fit")) == "too big"

    await wait_for(pilot, ready)


async def catalog_judged(pilot: Pilot[None], fake: FakeModels) -> None:
    await models_listed(pilot)
    await pilot.press("c")
    table = pilot.app.screen.query_one("#catalog-table", DataTable)

    def judged() -> bool:
        if table.row_count < len(fake.entries):
            return False
        return all(str(table.get_cell(e.name, "fit")) != "checking…" for e in fake.entries)

    await wait_for(pilot, judged)


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_models_local(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    app, _, history = models_app_for_snapshot(tmp_path, theme)
    assert snap_compare(app, terminal_size=size, run_before=models_listed)
    history.close()


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_models_catalog(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    app, fake, history = models_app_for_snapshot(tmp_path, theme)

    async def run_before(pilot: Pilot[None]) -> None:
        await catalog_judged(pilot, fake)
        table = pilot.app.screen.query_one("#catalog-table", DataTable)
        table.move_cursor(row=table.get_row_index(fake.entries[4].name))  # a row with an error
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
    history.close()


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_models_pull_in_progress(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    app, fake, history = models_app_for_snapshot(tmp_path, theme)
    first, second = fake.entries[0].name, fake.entries[2].name

    async def run_before(pilot: Pilot[None]) -> None:
        await catalog_judged(pilot, fake)
        fake.queue.add(first)
        fake.queue.add(second)
        table = pilot.app.screen.query_one("#catalog-table", DataTable)

        def shown() -> bool:
            items = pilot.app.screen.query(".pull-info").results(Static)
            texts = [str(i.render()) for i in items]
            return (
                str(table.get_cell(first, "status")) == "38%"
                and len(texts) == 2
                and "12.5 MiB/s" in texts[0]
                and texts[1] == "queued"
            )

        await wait_for(pilot, shown)

    try:
        assert snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        fake.release_all()
        history.close()


def chat_with_versions(path: Path) -> tuple[History, int]:
    """A stored chat whose prompt has two versions and whose last reply has three."""
    history = History(path)
    sid = history.create_session(model="fake-model")
    first = history.add_message(sid, "user", "Name a lighthouse")
    history.add_message(sid, "assistant", "The Tower of Hercules.")
    history.add_message(sid, "user", "Name a famous lighthouse", sibling_of=first)
    reply = history.add_message(sid, "assistant", "The Pharos of Alexandria.")
    history.add_message(sid, "assistant", "Eddystone, off Plymouth.", sibling_of=reply)
    history.add_message(sid, "assistant", "Cape Hatteras, in North Carolina.", sibling_of=reply)
    history._db.execute(
        "UPDATE sessions SET created=?, updated=? WHERE id=?",
        (FIXED_NOW - 300, FIXED_NOW - 60, sid),
    )
    return history, sid


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_message_with_versions(snap_compare, tmp_path, size, theme):
    """The focused reply shows "‹ 3/3 ›" and the footer its keys (←/→, r, e)."""
    history, sid = chat_with_versions(tmp_path / "sessions.sqlite3")
    app, _ = build_app(history, session_id=sid, theme=theme, clock_now=FIXED_NOW)

    async def ready(pilot):
        await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded)
        app.chat.query_one(PromptBox).cursor_blink = False
        await pilot.press("alt+up")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=ready)
    history.close()
