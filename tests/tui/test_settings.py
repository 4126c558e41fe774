"""The settings screen, saving to config.toml, and an app that starts on a bad config."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.commands.chat import load_config
from localfab.config import Config, Paths, save_settings
from localfab.errors import UsageError
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.screens.settings import SettingsScreen, hub_lines
from tests.fake_engine import FakeEngine, fake_loader
from tests.tui_support import wait_for

pytestmark = pytest.mark.anyio

SIZES = [(100, 30), (80, 24)]
THEMES = ["localfab-dark", "localfab-light"]
EXISTING = """# my settings
top_k = 20  # keep
flash_attn = "on"
"""


def paths_in(tmp_path: Path) -> Paths:
    return Paths(tmp_path / "config", tmp_path / "data", tmp_path / "cache")


def settings_app(
    tmp_path: Path, *, theme: str | None = None, notices: tuple[str, ...] = ()
) -> tuple[LocalfabApp, Paths]:
    paths = paths_in(tmp_path)
    history = History(tmp_path / "s.db")
    backend = LocalBackend(fake_loader(FakeEngine()), history, "fake-model", ChatOptions())
    app = make_app(
        AppDeps(
            backend=backend,
            history=history,
            model_name="fake-model",
            theme=theme,
            config=Config.load(paths, env={}),
            paths=paths,
            notices=notices,
        )
    )
    return app, paths


async def open_settings(pilot, app: LocalfabApp) -> SettingsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
    await pilot.press("f9")
    await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
    screen = app.screen
    assert isinstance(screen, SettingsScreen)
    screen.env = {"HF_ENDPOINT": "https://hf-mirror.example", "HF_TOKEN": "hf_secret"}
    return screen


def test_save_writes_only_the_changed_keys_and_keeps_the_rest(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text(EXISTING, encoding="utf-8")
    config = save_settings(paths, {"top_k": "30", "theme": "localfab-light", "top_p": 0.5})
    text = paths.config_file.read_text(encoding="utf-8")
    assert text.startswith('# my settings\ntop_k = 30\nflash_attn = "on"\n')
    assert tomllib.loads(text) == {
        "top_k": 30,
        "flash_attn": "on",
        "theme": "localfab-light",
        "top_p": 0.5,
    }
    assert (config.top_k, config.theme, config.flash_attn) == (30, "localfab-light", "on")


def test_save_refuses_a_bad_value_and_leaves_the_file_alone(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text(EXISTING, encoding="utf-8")
    with pytest.raises(UsageError, match="top_p must be a number from 0 to 1"):
        save_settings(paths, {"top_k": 5, "top_p": "1.5"})
    assert paths.config_file.read_text(encoding="utf-8") == EXISTING


def test_a_bad_config_gives_the_defaults_and_a_notice(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text("top_k = [\n", encoding="utf-8")
    config, problem = load_config(paths)
    assert config == Config()
    assert problem is not None and "not valid TOML" in problem and "default settings" in problem
    paths.config_file.write_text("top_k = 5\n", encoding="utf-8")
    assert load_config(paths) == (Config.load(paths), None)


def test_the_token_is_never_shown() -> None:
    shown = hub_lines({"HF_TOKEN": "hf_secret"})
    assert "hf_secret" not in shown and "HF_TOKEN: set" in shown
    assert "HF_TOKEN: not set" in hub_lines({})
    assert "huggingface.co (default)" in hub_lines({})


async def test_theme_applies_live_and_settings_are_saved(tmp_path: Path) -> None:
    app, paths = settings_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_settings(pilot, app)
        assert app.theme == "localfab-dark"
        screen.query_one("#settings-theme").value = "localfab-light"
        await wait_for(pilot, lambda: app.theme == "localfab-light")
        screen.query_one("#settings-temperature").value = "0.2"
        screen.query_one("#settings-max_continues").value = "5"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: paths.config_file.is_file())
        saved = tomllib.loads(paths.config_file.read_text(encoding="utf-8"))
        assert saved == {"temperature": 0.2, "max_continues": 5, "theme": "localfab-light"}
        assert app.config.temperature == 0.2 and app.config.max_continues == 5
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
    app.history.close()


async def test_a_malformed_value_is_refused_in_the_form(tmp_path: Path) -> None:
    app, paths = settings_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_settings(pilot, app)
        screen.query_one("#settings-threads").value = "9999"
        screen.query_one("#settings-top_k").value = "7"
        screen.action_save()
        await pilot.pause()
        problem = screen.query_one("#settings-problem")
        assert "threads must be 1 to 512" in str(problem.render())
        assert problem.has_class("-error")
        assert not paths.config_file.exists()
        assert app.config.top_k == Config().top_k


async def test_nothing_changed_writes_nothing(tmp_path: Path) -> None:
    app, paths = settings_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_settings(pilot, app)
        await pilot.click("#settings-save")
        await pilot.pause()
        assert "Nothing changed" in str(screen.query_one("#settings-problem").render())
        assert not paths.config_file.exists()


async def test_a_start_notice_is_shown(tmp_path: Path) -> None:
    app, _ = settings_app(tmp_path, notices=("config.toml is not valid TOML",))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(
            pilot, lambda: any("not valid TOML" in str(n.message) for n in app._notifications)
        )


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_settings_screen_snapshot(snap_compare, tmp_path, size, theme):
    app, _ = settings_app(tmp_path, theme=theme)

    async def ready(pilot):
        await open_settings(pilot, app)
        app.screen.query_one("#settings-hub").update(hub_lines(app.screen.env))
        app.set_focus(None)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=ready)
