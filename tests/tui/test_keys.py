"""Keys remapped by action id from config.toml's [keys] table, driven like a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localfab.config import Config, default_paths
from localfab.tui.widgets.sessions import SessionsPanel
from tests.fake_engine import FakeEngine
from tests.tui_support import build_app, finished, loaded, replies, send, wait_for

pytestmark = pytest.mark.anyio


def notices(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_a_remapped_key_stops_the_reply_and_the_old_key_does_not(history):
    engine = FakeEngine(hold_after=12)
    app, _ = build_app(history, engine=engine, keymap=(("stop", "ctrl+x"),))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            chat = await loaded(pilot, app)
            await send(pilot, app, "hi")
            await wait_for(pilot, lambda: len(replies(app)[-1].text) > 0 and chat.streaming)
            await pilot.press("escape")  # the default key: no longer bound to stop
            footer = str(replies(app)[-1].query_one(".reply-footer").render())
            assert chat.streaming and "stopping" not in footer
            await pilot.press("ctrl+x")
            await finished(pilot, app)
            assert chat.last_finish == "cancelled"
            assert "stopped" in str(replies(app)[-1].query_one(".reply-footer").render())
    finally:
        engine.release.set()


async def test_a_remapped_panel_key_toggles_once_and_the_old_one_not_at_all(history):
    app, _ = build_app(history, keymap={"chat.sessions": "f8"})
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app)
        panel = chat.query_one(SessionsPanel)
        shown = panel.display
        await pilot.press("ctrl+s")
        assert panel.display == shown
        await pilot.press("f8")
        assert panel.display != shown
        assert not any("Keys" in n for n in notices(app))


async def test_unknown_ids_and_bad_key_names_warn_and_the_defaults_stay(history):
    keymap = (("frobnicate", "f2"), ("stop", "ctrl+nosuchkey"), ("back", "f3"))
    engine = FakeEngine(hold_after=12)
    app, _ = build_app(history, engine=engine, keymap=keymap)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        said = " | ".join(notices(app))
        assert "keys.frobnicate: there is no such action" in said and "chat.stop" in said
        assert "'ctrl+nosuchkey' is not a key name" in said
        assert "several actions are called back" in said
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: len(replies(app)[-1].text) > 0 and chat.streaming)
        try:
            await pilot.press("escape")  # still the stop key
            await finished(pilot, app)
            assert chat.last_finish == "cancelled"
        finally:
            engine.release.set()


async def test_keys_from_config_toml_reach_the_app(history, tmp_path: Path):
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text('[keys]\n"chat.new" = "f7"\n', encoding="utf-8")
    config = Config.load(paths, env={})
    app, _ = build_app(history, keymap=config.keys)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        await send(pilot, app, "hello")
        await finished(pilot, app)
        first = app.backend.session_id
        assert first is not None and replies(app)
        await pilot.press("ctrl+n")  # the old key: the chat stays
        assert app.backend.session_id == first and replies(app)
        await pilot.press("f7")
        await wait_for(pilot, lambda: not replies(app))
        assert not chat.streaming


def test_every_screens_actions_are_known_before_the_screen_is_opened() -> None:
    """In a fresh interpreter, before any screen but the chat was imported, the keymap check
    knows the actions of the screens that open later (models, fit, settings, search)."""
    code = (
        "import sys\n"
        "from localfab.tui.widgets.keymap import binding_ids\n"
        "assert 'localfab.tui.screens.models' not in sys.modules\n"
        "print(' '.join(sorted(binding_ids())))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    ids = set(out.stdout.split())
    assert {"models.back", "fit.back", "settings.back", "search.close", "chat.stop"} <= ids
