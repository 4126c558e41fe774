"""Themes are data: built-in ones from themes/ (or the installed package), user ones from the
config folder; a broken file is reported, never fatal."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.color import Color
from textual.theme import Theme

from localfab.chat.history import History
from localfab.tui.themes import ThemeError, builtin_theme_files, load_themes, parse_theme
from tests.tui_support import build_app, loaded, wait_for

ROOT = Path(__file__).resolve().parents[2]


def luminance(colour: str) -> float:
    """WCAG relative luminance."""
    c = Color.parse(colour)

    def channel(v: int) -> float:
        s = v / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b)


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours."""
    la = luminance(a)
    lb = luminance(b)
    hi, lo = max(la, lb), min(la, lb)
    return (hi + 0.05) / (lo + 0.05)


def test_the_built_in_themes_are_the_files_in_themes():
    loaded_themes = load_themes(None)
    assert loaded_themes.problems == ()
    names = {t.name for t in loaded_themes.themes}
    files = {p.stem for p in (ROOT / "themes").glob("*.toml")}
    assert names == files
    assert len(names) >= 3
    assert {t.dark for t in loaded_themes.themes} == {True, False}


@pytest.mark.parametrize("theme", load_themes(None).themes, ids=lambda t: t.name)
def test_every_built_in_theme_is_readable(theme):
    # Body text at least WCAG AA (4.5:1) on the background and on surfaces; accents at 3:1.
    for ground in (theme.background, theme.surface, theme.panel):
        assert contrast(theme.foreground, ground) >= 4.5, (theme.name, ground)
    for colour in (theme.primary, theme.secondary, theme.warning, theme.error):
        assert contrast(colour, theme.background) >= 3.0, (theme.name, colour)


def test_user_themes_load_and_broken_ones_are_reported(tmp_path):
    (tmp_path / "mine.toml").write_text('name = "mine"\nprimary = "#FF0000"\ndark = false\n')
    (tmp_path / "broken.toml").write_text('name = "broken"\nprimary = "not a colour"\n')
    (tmp_path / "bad-toml.toml").write_text("name = \n")
    (tmp_path / "notes.txt").write_text("not a theme")
    result = load_themes(tmp_path)
    assert "mine" in {t.name for t in result.themes}
    assert len(result.problems) == 2
    assert any("broken.toml" in p and "primary" in p for p in result.problems)
    assert any("bad-toml.toml" in p and "TOML" in p for p in result.problems)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('primary = "#000000"', "missing name"),
        ('name = "x"\nprimary = "#000"\nshiny = true', "unknown key"),
        ('name = "x"\nprimary = "#000"\ndark = "yes"', "dark must be"),
        ('name = "has space"\nprimary = "#000"', "name must be"),
        ('name = "x"\nprimary = "#000"\nvariables = 3', "[variables]"),
    ],
)
def test_theme_validation_says_what_is_wrong(text, complaint):
    with pytest.raises(ThemeError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        parse_theme(text, "test.toml")


def test_packaged_themes_come_first(tmp_path, monkeypatch):
    from localfab import resources

    packaged = tmp_path / "_themes"
    packaged.mkdir()
    (packaged / "only.toml").write_text('name = "only"\nprimary = "#123456"\n')
    monkeypatch.setattr(resources, "builtin_theme_files", lambda: [packaged / "only.toml"])
    assert [f.name for f in builtin_theme_files()] == ["only.toml"]
    # An install without the package data still finds the repository's themes/.
    monkeypatch.setattr(resources, "builtin_theme_files", lambda: [])
    assert {f.name for f in builtin_theme_files()} == {
        p.name for p in (ROOT / "themes").glob("*.toml")
    }


@pytest.mark.anyio
async def test_a_broken_user_theme_is_a_notification_and_the_app_starts(tmp_path):
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    (themes_dir / "oops.toml").write_text('name = "oops"\nprimary = 12\n')
    (themes_dir / "ocean.toml").write_text(
        'name = "ocean"\nprimary = "#2E86AB"\nbackground = "#0B1D26"\nforeground = "#E8F1F2"\n'
    )
    history = History(tmp_path / "s.db")
    app, _ = build_app(history, themes_dir=themes_dir, theme="ocean")
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "ocean"
        await wait_for(pilot, lambda: any("oops.toml" in n.message for n in app._notifications))
    history.close()


HOSTILE_VARIABLES = {
    "not a colour": '"footer-key-foreground" = "not a colour !!"',
    "injected CSS": '"footer-key-foreground" = "red; } Screen { display: none"',
    "balanced injection": '"x" = "red; } Screen { display: none; } Foo { color: red"',
    "names itself": '"footer-key-foreground" = "$footer-key-foreground"',
    "a colour for a text style": '"block-cursor-text-style" = "#FF0000"',
    "names another variable": '"footer-key-foreground" = "$accent"',
    "a text colour where a border goes": '"border" = "auto 50%"',
}


@pytest.mark.parametrize("case", list(HOSTILE_VARIABLES))
def test_a_theme_variable_must_be_one_css_value(case: str) -> None:
    text = f'name = "mine"\nprimary = "#FF0000"\n[variables]\n{HOSTILE_VARIABLES[case]}\n'
    with pytest.raises(ThemeError, match="variable"):
        parse_theme(text, "user theme mine.toml")


def test_good_theme_variables_load() -> None:
    text = (
        'name = "mine"\nprimary = "#FF0000"\n[variables]\n"footer-key-foreground" = "#88C0D0"\n'
        '"input-selection-background" = "#81a1c1 35%"\n"block-cursor-text-style" = "none"\n'
    )
    assert parse_theme(text, "user theme mine.toml").variables["block-cursor-text-style"] == "none"


def every_textual_variable() -> dict[str, str]:
    """Each of Textual's theme variables with its own default value."""
    return Theme(name="x", primary="#FF0000").to_color_system().generate()


def test_textuals_own_variables_with_their_own_values_load() -> None:
    """Such as `auto 87%` for text and `bold not underline` for link-style-hover: none refused."""
    lines = [f'"{k}" = "{v}"' for k, v in every_textual_variable().items()]
    text = 'name = "mine"\nprimary = "#FF0000"\n[variables]\n' + "\n".join(lines) + "\n"
    assert parse_theme(text, "user theme mine.toml").variables == every_textual_variable()


@pytest.mark.anyio
async def test_the_app_starts_on_a_user_theme_that_sets_every_variable(tmp_path: Path) -> None:
    """What the check lets through, the app's stylesheet takes."""
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    values = every_textual_variable() | {"border": "#81a1c1 35%", "link-style": "bold"}
    lines = [f'"{k}" = "{v}"' for k, v in values.items()]
    (themes_dir / "mine.toml").write_text(
        'name = "mine"\nprimary = "#FF0000"\n[variables]\n' + "\n".join(lines) + "\n"
    )
    history = History(tmp_path / "s.db")
    app, _ = build_app(history, themes_dir=themes_dir, theme="mine")
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "mine" and app.is_running
        assert not app.theme_problems
    history.close()


@pytest.mark.anyio
async def test_a_chosen_user_theme_with_injected_css_is_reported_and_not_used(
    tmp_path: Path,
) -> None:
    """`theme = "mine"` names a theme whose variable holds CSS: the app starts on the default."""
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    (themes_dir / "mine.toml").write_text(
        f'name = "mine"\nprimary = "#FF0000"\n[variables]\n{HOSTILE_VARIABLES["injected CSS"]}\n'
    )
    history = History(tmp_path / "s.db")
    app, _ = build_app(history, themes_dir=themes_dir, theme="mine")
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "localfab-dark" and app.is_running
        await wait_for(pilot, lambda: any("mine.toml" in n.message for n in app._notifications))
        assert any("'mine' is not installed" in n.message for n in app._notifications)
    history.close()


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(HOSTILE_VARIABLES))
async def test_a_user_theme_named_like_the_default_with_bad_variables_is_not_used(
    tmp_path: Path, case: str
) -> None:
    """It would replace localfab-dark, which the app starts on even with no `theme =`: it is
    reported and the built-in one is used."""
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    (themes_dir / "mine.toml").write_text(
        f'name = "localfab-dark"\nprimary = "#FF0000"\n[variables]\n{HOSTILE_VARIABLES[case]}\n'
    )
    history = History(tmp_path / "s.db")
    app, _ = build_app(history, themes_dir=themes_dir)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        assert app.theme == "localfab-dark" and app.current_theme.primary == "#4FB3BF"
        await wait_for(pilot, lambda: any("mine.toml" in n.message for n in app._notifications))
        assert app.is_running
    history.close()
