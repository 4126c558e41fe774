"""How the chat screen looks: pytest-textual-snapshot at 100x30 and 80x24, dark and light.

Deterministic: a stored chat on the fake engine, a fixed clock for the sessions panel, no cursor
blink. Update the stored SVGs with `pytest tests/test_tui_snapshots.py --snapshot-update` after
looking at them (`snapshot_report.html`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.tui.fake import SAMPLE_REPLY
from localfab.tui.widgets.prompt import PromptBox
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
        history._db.execute(
            "UPDATE sessions SET created=?, updated=? WHERE id=?",
            (FIXED_NOW - 86400 * (3 - i), FIXED_NOW - 86400 * (3 - i), sid),
        )
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "Compare two small models, with code")
    history.add_message(sid, "assistant", SAMPLE_REPLY)
    history.add_message(sid, "user", "And in one line?")
    history.add_message(sid, "assistant", "Smaller models are faster but", status="length")
    history._db.execute(
        "UPDATE sessions SET created=?, updated=? WHERE id=?",
        (FIXED_NOW - 300, FIXED_NOW - 60, sid),
    )
    return history, sid


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chat_screen(snap_compare, tmp_path, size, theme):
    history, sid = stored_chat(tmp_path / "sessions.sqlite3")
    app, _ = build_app(history, session_id=sid, theme=theme, clock_now=FIXED_NOW)

    async def ready(pilot):
        await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded)
        box = app.chat.query_one(PromptBox)
        box.cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=ready)
    history.close()


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
def test_models_screen(snap_compare, tmp_path, size, theme):
    from localfab.tui.app import make_app
    from tests.test_tui_models import Models

    history = History(tmp_path / "sessions.sqlite3")
    app = make_app(backend=None, history=history, models=Models(), theme=theme)

    async def listed(pilot):
        def ready() -> bool:
            tables = app.screen.query("#models-table")
            if not tables or tables.first().row_count < 2:
                return False
            return str(tables.first().get_cell("big", "fit")) == "too big"

        await wait_for(pilot, ready)

    assert snap_compare(app, terminal_size=size, run_before=listed)
    history.close()
