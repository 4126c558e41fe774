"""A user theme is bounded: a file too large, with too many variables or too long a value is
refused with a note, and the app starts on its own theme (at once, not minutes later)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.tui.themes import (
    MAX_THEME_BYTES,
    MAX_THEME_VARIABLES,
    ThemeError,
    load_themes,
    parse_theme,
)
from tests.tui.test_themes import every_textual_variable
from tests.tui_support import build_app, loaded, wait_for

HEAD = 'name = "mine"\nprimary = "#FF0000"\n[variables]\n'


def many_variables(count: int) -> str:
    return HEAD + "".join(f'"v{i}" = "#FF0000"\n' for i in range(count))


@pytest.mark.anyio
async def test_a_theme_with_200000_variables_is_refused_and_the_app_starts(tmp_path: Path) -> None:
    """The report: such a theme (chosen in the config) kept the app from starting."""
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    (themes_dir / "mine.toml").write_text(many_variables(200_000))
    history = History(tmp_path / "s.db")
    began = time.monotonic()
    app, _ = build_app(history, themes_dir=themes_dir, theme="mine")
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "localfab-dark" and app.is_running
        await wait_for(pilot, lambda: any("mine.toml" in n.message for n in app._notifications))
        assert any("too large" in n.message for n in app._notifications)
    assert time.monotonic() - began < 30  # it took minutes, here or in the stylesheet
    history.close()


def test_a_theme_file_is_read_no_further_than_a_theme_holds(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text(HEAD + '"v" = "#FF0000"\n' + "# padding\n" * (MAX_THEME_BYTES // 10))
    assert big.stat().st_size > MAX_THEME_BYTES
    found = load_themes(tmp_path)
    assert "mine" not in {t.name for t in found.themes}
    assert any("big.toml" in p and "too large" in p for p in found.problems)


def test_too_many_variables_in_a_small_file_are_refused() -> None:
    """Short names fit thousands of variables in a small file: the count has its own bound."""
    text = HEAD + "".join(f'"v{i}" = "red"\n' for i in range(MAX_THEME_VARIABLES + 1))
    assert len(text) < MAX_THEME_BYTES
    with pytest.raises(ThemeError, match="variables"):
        parse_theme(text, "user theme mine.toml")


def test_a_value_too_long_is_refused() -> None:
    with pytest.raises(ThemeError, match="not one value"):
        parse_theme(HEAD + f'"v" = "{"#FF0000 " * 50}"\n', "user theme mine.toml")


def test_every_textual_variable_fits_the_bounds() -> None:
    """The bounds leave room for a theme that sets each of Textual's variables."""
    assert len(every_textual_variable()) < MAX_THEME_VARIABLES
    parse_theme(many_variables(MAX_THEME_VARIABLES), "user theme mine.toml")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_named_like_a_theme_is_skipped_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.toml")
    found = load_themes(tmp_path)
    assert any("pipe.toml" in p and "not a file" in p for p in found.problems)
