"""Text from outside the app is shown as text, never read as markup.

A remote server's error, a model's name, a model file's name, a tool's name, a theme's value or
a config value can hold `[/x]` (a closing tag with no opening one: Textual raises MarkupError and
the app ends) or `[@click=app.quit]quit[/]` (an action link a click would run). Each place where
such text reaches a widget or a toast is driven with it here, in the real app (a real remote over
a socket where the text comes from one), and the screen must show the brackets as they are; a
static check then holds every Label, Static, table cell, title and palette entry in
localfab/tui to the rule, so that a new one cannot slip by.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.style import Style
from textual.app import App, ComposeResult
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import DataTable

from localfab.chat.history import History
from localfab.remote.client import Remote
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.backend import ToolResultShown
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.models import ModelRow
from localfab.tui.remote_backend import remote_loader
from localfab.tui.screens.chat_parts import ListedCommands
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.tool_cards import ToolResultCard
from tests.fake_engine import FakeEngine, fake_loader
from tests.remote.fakeremote import FakeRemote, fake_remote
from tests.tui.test_remote import RemoteModels
from tests.tui_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
# A closing tag with no opening one (MarkupError), an action link, a style.
HOSTILE = "[/x] [@click=app.quit]quit[/] [bold]b"
# The same without "/", for a file name (the model's name is the file's, without folders).
HOSTILE_NAME = "[@click=app.quit]quit [bold]b[x=1"


def screen_text(app: App[None]) -> str:
    """What the screen shows, line by line (the compositor's full frame, toasts included)."""
    update = app.screen._compositor.render_full_update()
    return "\n".join("".join(strip.text for strip in line) for line in update.strips)


def action_links(app: App[None]) -> list[str]:
    """The `@click` actions of what the screen shows that run `app.quit`."""
    update = app.screen._compositor.render_full_update()
    found = []
    for line in update.strips:
        for strip in line:
            for segment in strip:
                style = segment.style
                if isinstance(style, Style) and "quit" in str(style.meta.get("@click", "")):
                    found.append(str(style.meta["@click"]))
    return found


def shows(app: App[None], text: str) -> bool:
    return text in screen_text(app)


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def remote_app(url: str, history: History) -> LocalfabApp:
    backend = LocalBackend(
        remote_loader(Remote(url, name="box")), history, "box", ChatOptions(max_tokens=16)
    )
    return make_app(AppDeps(backend=backend, history=history, model_name="box"))


@pytest.mark.anyio
async def test_a_remote_500_with_markup_in_its_message_is_shown_and_the_app_runs(
    remote: tuple[FakeRemote, str], tmp_path: Path
) -> None:
    """The original report: the footer's label and the toast took the message as markup."""
    fake, url = remote
    fake.model_path = f"/models/{HOSTILE_NAME}.gguf"
    history = History(tmp_path / "s.db")
    app = remote_app(url, history)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: bool(app.screen_stack) and app.chat.loaded, seconds=30)
        # The model's name (the server's file) in the status bar.
        assert str(app.chat.query_one("#status-model").render()) == f"{HOSTILE_NAME}.gguf"
        fake.mode, fake.message = "500", HOSTILE
        await pilot.press(*"Hi", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1, seconds=30)
        assert app.chat.last_finish == "failed"
        reply = [v for v in app.chat.query(MessageView) if v.role == "assistant"][-1]
        footer = str(reply.query_one(".reply-footer").render())
        assert HOSTILE in footer
        await wait_for(pilot, lambda: shows(app, HOSTILE))  # the toast (over the footer)
        assert action_links(app) == []
        assert app.is_running
    assert app.backend is not None
    app.backend.close()  # as `localfab chat` does when the app ends: the connection goes
    history.close()


@pytest.mark.anyio
async def test_notes_and_toasts_show_their_text_literally(tmp_path: Path) -> None:
    """Every `notify` of the app and its screens: a toast with the brackets as they are (and
    its title, which Textual never reads as markup)."""
    history = History(tmp_path / "s.db")
    app = make_app(
        AppDeps(
            backend=LocalBackend(fake_loader(FakeEngine()), history, "m", ChatOptions()),
            history=history,
            model_name="m",
        )
    )
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: bool(app.screen_stack) and app.chat.loaded)
        app.notify(HOSTILE, title=HOSTILE)
        app.chat.notify(f"screen: {HOSTILE}", severity="warning")
        await wait_for(pilot, lambda: shows(app, f"screen: {HOSTILE}"))
        assert screen_text(app).count(HOSTILE) >= 3
        assert action_links(app) == []
        assert app.is_running
    history.close()


@pytest.mark.anyio
async def test_a_model_name_with_markup_is_shown_as_it_is(tmp_path: Path) -> None:
    """The name a chat is opened on (a file's, or a config's): welcome line, load panel and
    status bar."""
    history = History(tmp_path / "s.db")
    backend = LocalBackend(
        fake_loader(FakeEngine(), name=HOSTILE, steps=3), history, HOSTILE, ChatOptions()
    )
    app = make_app(AppDeps(backend=backend, history=history, model_name=HOSTILE))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: bool(app.screen_stack) and app.chat.loaded)
        assert shows(app, f"Chat with {HOSTILE}.")
        assert str(app.chat.query_one("#status-model").render()) == HOSTILE
        assert action_links(app) == []
    history.close()


class HostileModels(RemoteModels):
    """Local model files and remote servers whose names and messages hold markup."""

    def rows(self) -> list[ModelRow]:
        return [ModelRow(HOSTILE_NAME, "241 MB", "Q4_K_M", "[/arch]", "just now")]

    def fit(self, row: ModelRow) -> str | None:
        return "[/fit]"

    def remote_rows(self) -> list:  # type: ignore[type-arg]
        from localfab.remote.listing import RemoteRow

        return [RemoteRow(HOSTILE_NAME, "", HOSTILE)]


@pytest.mark.anyio
async def test_the_models_screen_shows_names_and_errors_as_they_are(tmp_path: Path) -> None:
    """Table cells (DataTable reads a `str` cell as markup), a fit verdict set later, the
    remote tab's rows and the note a row that cannot be opened gives."""
    history = History(tmp_path / "s.db")
    app = make_app(
        AppDeps(backend=None, history=history, models=HostileModels(), backend_factory=None)
    )
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        table = await _table(pilot, "#models-table", 1)
        await wait_for(pilot, lambda: str(table.get_cell(HOSTILE_NAME, "fit")) == "[/fit]")
        await wait_for(pilot, lambda: shows(app, "[/fit]"))
        text = screen_text(app)
        assert HOSTILE_NAME[:20] in text and "[/arch]" in text
        app.screen.action_show_remote()  # type: ignore[attr-defined]
        remote = await _table(pilot, "#remote-table", 0)
        await pilot.press("r")
        await wait_for(pilot, lambda: remote.row_count == 1)
        remote.focus()
        await pilot.press("enter")  # a server that is down: its message as a note
        await wait_for(pilot, lambda: shows(app, HOSTILE))
        assert HOSTILE_NAME[:20] in screen_text(app)
        assert action_links(app) == []
        assert app.is_running
    history.close()


async def _table(pilot: Pilot[None], selector: str, rows: int) -> DataTable[object]:
    def found() -> DataTable[object] | None:
        tables = list(pilot.app.screen.query(selector).results(DataTable))
        return tables[0] if tables else None

    await wait_for(pilot, lambda: (t := found()) is not None and t.row_count >= rows)
    table = found()
    assert table is not None
    return table


@pytest.mark.anyio
async def test_a_theme_whose_value_holds_markup_is_reported_as_it_is(tmp_path: Path) -> None:
    """A refused theme's note quotes the value, and the config's theme name it names."""
    themes_dir = tmp_path / "themes"
    themes_dir.mkdir()
    (themes_dir / "mine.toml").write_text(
        f'name = "mine"\nprimary = "#FF0000"\n[variables]\n"x" = "{HOSTILE}"\n'
    )
    history = History(tmp_path / "s.db")
    backend = LocalBackend(fake_loader(FakeEngine()), history, "m", ChatOptions())
    app = make_app(AppDeps(backend=backend, history=history, theme=HOSTILE, themes_dir=themes_dir))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: bool(app.screen_stack) and app.chat.loaded)
        notes = app._notifications
        await wait_for(pilot, lambda: sum(HOSTILE in n.message for n in notes) == 2)
        await wait_for(pilot, lambda: shows(app, "mine.toml") and shows(app, HOSTILE))
        assert shows(app, f"theme '{HOSTILE}'")
        assert action_links(app) == []
        assert app.is_running and app.theme == "localfab-dark"
    history.close()


class CardApp(App[None]):
    def compose(self) -> ComposeResult:
        yield ToolResultCard(f"srv__{HOSTILE}", ToolResultShown(HOSTILE, "ok"))


@pytest.mark.anyio
async def test_a_tool_result_card_shows_the_tools_name_and_result_as_they_are() -> None:
    app = CardApp()
    async with app.run_test(size=(100, 20), notifications=True) as pilot:
        card = app.query_one(ToolResultCard)
        card.collapsed = False
        await pilot.pause()
        await wait_for(pilot, lambda: screen_text(app).count(HOSTILE) >= 2)  # title, output
        assert action_links(app) == []


class HostileCommands(ListedCommands):
    """As the chat's MCP entries: a server's prompt named and described with markup."""

    def _commands(self) -> list[tuple[str, str, object]]:  # type: ignore[override]
        return [(f"Prompt: srv/{HOSTILE}", f"help {HOSTILE}", lambda: None)]


class PaletteApp(App[None]):
    COMMANDS = {HostileCommands}


@pytest.mark.anyio
async def test_command_palette_entries_show_their_names_and_help_as_they_are() -> None:
    """Textual reads a palette entry's name (when it highlights it) and help as markup."""
    app = PaletteApp()
    async with app.run_test(size=(120, 30), notifications=True) as pilot:
        app.action_command_palette()
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        await wait_for(pilot, lambda: shows(app, f"help {HOSTILE}"))  # discovered: all shown
        await pilot.press(*"prompt")  # searched: the name with the matched letters picked out
        await wait_for(pilot, lambda: shows(app, f"Prompt: srv/{HOSTILE}"))
        assert shows(app, f"help {HOSTILE}")
        assert action_links(app) == []


# --- the static net --------------------------------------------------------------------------

# Widgets that take `markup=` (a later `update()` with a str is read the same way).
MARKUP_WIDGETS = {"Label", "Static"}
# Where Textual reads a str as markup with no switch: the argument (position, keyword) and the
# helpers that make it safe.
WRAPPED: dict[str, tuple[int | None, str | None, set[str]]] = {
    # Every positional argument. (`rich_text`: a Markdown table's cells, already parsed, as
    # Rich Text for a Rich table.)
    "add_row": (None, None, {"plain_cell", "rich_text"}),
    "add_column": (0, "label", {"plain_cell", "rich_text"}),
    "update_cell": (2, "value", {"plain_cell"}),
    "Button": (0, "label", {"plain"}),
    "Collapsible": (None, "title", {"escaped"}),
    "Hit": (1, "match_display", {"palette_name"}),
    "DiscoveryHit": (0, "display", {"plain"}),
}
HELP_WRAP = {"Hit", "DiscoveryHit"}  # and their `help=`: `escaped`
TITLES = {"border_title", "border_subtitle", "tooltip", "title", "sub_title"}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _safe(node: ast.expr, helpers: set[str]) -> bool:
    """A literal, a constant's name, or a call of one of `helpers`."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name) and node.id.isupper():
        return True
    if isinstance(node, ast.Call) and _name(node.func) in helpers:
        return True
    if isinstance(node, ast.Starred) and isinstance(node.value, ast.GeneratorExp):
        return _safe(node.value.elt, helpers)
    return False


def _super_inits(tree: ast.Module) -> dict[int, str]:
    """`super().__init__(...)` calls in classes made from a widget this check knows, by the
    call's id: the widget's name (such a call makes that widget)."""
    known = MARKUP_WIDGETS | set(WRAPPED)
    calls: dict[int, str] = {}
    for cls in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)):
        base = next((_name(b) for b in cls.bases if _name(b) in known), None)
        if base is None:
            continue
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__init__"
                and isinstance(node.func.value, ast.Call)
                and _name(node.func.value.func) == "super"
            ):
                calls[id(node)] = base
    return calls


def markup_problems(source: str, where: str) -> list[str]:
    """The places in `source` where outside text could reach Textual markup."""
    tree = ast.parse(source)
    inits = _super_inits(tree)
    problems: list[str] = []

    def say(node: ast.AST, what: str) -> None:
        problems.append(f"{where}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = inits.get(id(node)) or _name(node.func)
            if name in MARKUP_WIDGETS and not _markup_off(node):
                say(node, f"{name}(...) without markup=False")
            if name in WRAPPED:
                position, keyword, helpers = WRAPPED[name]
                args: list[ast.expr] = []
                if position is None and keyword is None:
                    args = list(node.args)
                elif position is not None and len(node.args) > position:
                    args = [node.args[position]]
                args += [k.value for k in node.keywords if k.arg == keyword]
                for arg in args:
                    if not _safe(arg, helpers):
                        say(node, f"{name}: text not through {'/'.join(sorted(helpers))}")
            if name in HELP_WRAP:
                for k in node.keywords:
                    if k.arg == "help" and not _safe(k.value, {"escaped"}):
                        say(node, f"{name}: help not through escaped")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr in TITLES:
                    value = node.value
                    ok = _safe(value, {"plain"}) or (
                        isinstance(value, ast.Name) and value.id == "None"
                    )
                    if not ok:
                        say(node, f"{target.attr} = text not through plain")
    return problems


def _markup_off(call: ast.Call) -> bool:
    return any(
        k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in call.keywords
    )


def tui_sources() -> list[Path]:
    return sorted((ROOT / "localfab" / "tui").rglob("*.py"))


def test_the_static_check_finds_markup_sinks() -> None:
    """The net itself: each kind of place it looks at is caught when the text is not wrapped."""
    bad = """
class Divider(Static):
    def __init__(self, name):
        super().__init__(f"-- {name} --")

def compose(self, name, error, row, table):
    yield Label(f"Fit: {name}")
    yield Static(error, id="x")
    table.add_row(row.name, row.size)
    table.add_column(name)
    table.update_cell("k", "fit", error)
    yield Button(name)
    yield Collapsible(title=name)
    yield Hit(1, matcher.highlight(name), cb, help=error)
    yield DiscoveryHit(name, cb, help=error)
    self.border_title = name

class Card(Collapsible):
    def __init__(self, name):
        super().__init__(Static("x", markup=False), title=name)
"""
    found = markup_problems(bad, "bad.py")
    assert len(found) == 15, found
    good = """
class Divider(Static):
    def __init__(self, name):
        super().__init__(f"-- {name} --", markup=False)

def compose(self, name, error, row, table):
    yield Label(f"Fit: {name}", markup=False)
    table.add_row(plain_cell(row.name), *(plain_cell(c) for c in row), key=row.name)
    table.add_column(plain_cell(name), key=name.lower())
    table.update_cell("k", "fit", plain_cell(error))
    yield Button("OK")
    yield Collapsible(title=escaped(name))
    yield Hit(1, palette_name(matcher, name), cb, help=escaped(error))
    yield DiscoveryHit(plain(name), cb, help=escaped(error))
    self.border_title = EDIT_TITLE
    self.border_title = None

class Card(Collapsible):
    def __init__(self, name):
        super().__init__(Static("x", markup=False), title=escaped(name))
"""
    assert markup_problems(good, "good.py") == []


def test_no_place_in_the_app_passes_text_to_markup() -> None:
    problems = [
        p
        for path in tui_sources()
        for p in markup_problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert problems == []
