"""Themes as data: TOML files with Textual theme variables, built-in and from the user.

Built-in themes are package data (`localfab.resources.builtin_theme_files`, the repository's
`themes/` installed as `localfab._themes`); a source checkout whose install predates that
mapping reads `themes/` directly. User themes live in `<config dir>/themes/` in the same format.
A file that cannot be read or does not validate is reported, never fatal.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib.resources.abc import Traversable
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

COLOUR_KEYS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "success",
    "warning",
    "error",
)
REQUIRED = ("name", "primary")
# What a theme file may hold. Each variable is checked by parsing CSS with it (and the app's whole
# stylesheet is built with all of them), so 200,000 of them would keep the app from starting for
# minutes. Textual itself has under 200 variables; a theme with every one of them is a few KiB.
MAX_THEME_BYTES = 64 * 1024
_KIB = MAX_THEME_BYTES // 1024
MAX_THEME_VARIABLES = 400
MAX_VALUE_CHARS = 100
DEFAULT_DARK = "localfab-dark"
DEFAULT_LIGHT = "localfab-light"
_REPO_THEMES = Path(__file__).resolve().parent.parent.parent / "themes"


class ThemeError(ValueError):
    """A theme file that cannot be used, with what is wrong in it."""


@dataclass(frozen=True)
class LoadedThemes:
    themes: tuple[Theme, ...]
    problems: tuple[str, ...]


def parse_theme(text: str, source: str) -> Theme:
    """A Theme from TOML text; `ThemeError` says what is wrong and where."""
    if len(text) > MAX_THEME_BYTES:
        raise ThemeError(f"{source}: too large (a theme file holds at most {_KIB} KiB)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ThemeError(f"{source}: not valid TOML ({exc})") from exc
    missing = [k for k in REQUIRED if not data.get(k)]
    if missing:
        raise ThemeError(f"{source}: missing {', '.join(missing)}")
    known = {"name", "dark", "variables", *COLOUR_KEYS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ThemeError(f"{source}: unknown key(s) {', '.join(unknown)}")
    name = data["name"]
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ThemeError(f"{source}: name must be letters, digits, '-' or '_'")
    colours: dict[str, str] = {}
    for key in COLOUR_KEYS:
        if key in data:
            value = data[key]
            try:
                if not isinstance(value, str):
                    raise TypeError(value)
                Color.parse(value)
            except (ColorParseError, TypeError) as exc:
                raise ThemeError(f"{source}: {key} = {value!r} is not a colour") from exc
            colours[key] = value
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeError(f"{source}: dark must be true or false")
    variables = _variables(data.get("variables", {}), source)
    theme = Theme(name=name, primary=colours.pop("primary"), dark=dark, variables=variables)
    for key, value in colours.items():
        setattr(theme, key, value)
    _check_variables(theme, source)
    return theme


def _variables(variables: object, source: str) -> dict[str, str]:
    """The `[variables]` table, if it maps names to strings and is not too long."""
    if not isinstance(variables, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in variables.items()
    ):
        raise ThemeError(f"{source}: [variables] must map names to strings")
    if len(variables) > MAX_THEME_VARIABLES:
        raise ThemeError(
            f"{source}: {len(variables):,} variables (a theme sets at most {MAX_THEME_VARIABLES})"
        )
    return dict(variables)


_VARIABLE_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
# Where Textual's CSS puts a theme variable: a colour variable goes in these properties, a
# `*-style*` one in text-style.
_COLOUR_USES = ("color: $v", "background: $v", "border: tall $v")
_STYLE_USES = ("text-style: $v",)


def _parses(declaration: str, variables: dict[str, str]) -> bool:
    """Whether `declaration` (which names `$v`) is valid CSS with these variables."""
    from textual.css.stylesheet import Stylesheet

    sheet = Stylesheet(variables=variables)
    sheet.add_source(f"Screen {{ {declaration}; }}")
    try:
        sheet.parse()
    except Exception:  # noqa: BLE001 - Textual's CSS errors have no one base class
        return False
    return True


def _check_variables(theme: Theme, source: str) -> None:
    """Each variable must be one value that Textual's CSS reads wherever such a variable is used:
    a colour (with an optional alpha), or a text style for a `*-style*` one. The app's whole
    stylesheet is built with them, so one bad value (text, injected CSS such as `red; } Screen {
    display: none`, a variable that names itself) would stop the app from starting."""
    # Textual's own variables, with their values before this theme's (which replace them).
    defaults = replace(theme, variables={}).to_color_system().generate()
    for name, value in theme.variables.items():
        is_style = "style" in name.split("-")
        example = "a text style such as bold or none" if is_style else "a colour such as #88C0D0"
        if not _VARIABLE_NAME.fullmatch(name):
            raise ThemeError(
                f"{source}: variable {name!r} is not a theme variable's name (lower-case letters, "
                "digits and '-')"
            )
        if any(c in value for c in ";{}\n\r") or len(value) > MAX_VALUE_CHARS:
            raise ThemeError(
                f"{source}: variable {name} = {value!r} is not one value: give {example}"
            )
        if "$" in value:  # Textual reads a variable's value as is, never another variable
            raise ThemeError(
                f"{source}: variable {name} = {value!r} names a variable: give {example}"
            )
        uses: tuple[str, ...] = _STYLE_USES if is_style else _COLOUR_USES
        if name in defaults:  # Textual's own: only where its default value goes ("auto 87%")
            uses = tuple(u for u in uses if _parses(u, {"v": defaults[name]})) or uses
        if not all(_parses(use, {"v": value}) for use in uses):
            raise ThemeError(f"{source}: variable {name} = {value!r} is not {example}")


def _theme_files(folder: Traversable | Path) -> list[Traversable | Path]:
    try:
        if not folder.is_dir():
            return []
        return sorted(
            (f for f in folder.iterdir() if f.name.endswith(".toml")), key=lambda f: f.name
        )
    except OSError:
        return []


def builtin_theme_files() -> list[Traversable | Path]:
    """The shipped theme files: package data first, the repository's themes/ otherwise."""
    from localfab import resources

    files: list[Traversable | Path] = list(resources.builtin_theme_files())
    return files or _theme_files(_REPO_THEMES)


def _read(file: Traversable | Path, source: str) -> str:
    """A theme file's text, read no further than a theme may hold (nor from what is no file:
    a FIFO would block the app's start)."""
    if not file.is_file():
        raise ThemeError(f"{source}: not a file")
    with file.open("rb") as f:
        data = f.read(MAX_THEME_BYTES + 1)
    if len(data) > MAX_THEME_BYTES:
        raise ThemeError(f"{source}: too large (a theme file holds at most {_KIB} KiB)")
    return data.decode("utf-8")


def _load(files: Iterable[Traversable | Path], kind: str) -> tuple[list[Theme], list[str]]:
    themes: list[Theme] = []
    problems: list[str] = []
    for file in files:
        source = f"{kind} theme {file.name}"
        try:
            themes.append(parse_theme(_read(file, source), source))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{source}: cannot be read ({exc})")
        except ThemeError as exc:
            problems.append(str(exc))
    return themes, problems


def load_themes(user_dir: Path | None) -> LoadedThemes:
    """Built-in themes, then the user's (a user theme may replace a built-in one by name)."""
    themes, problems = _load(builtin_theme_files(), "built-in")
    if user_dir is not None:
        user, user_problems = _load(_theme_files(user_dir), "user")
        themes.extend(user)
        problems.extend(user_problems)
    return LoadedThemes(tuple(themes), tuple(problems))
