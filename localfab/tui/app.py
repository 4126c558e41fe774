"""The localfab terminal app and its factory, shared by the CLI, the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen

from localfab.chat.history import History
from localfab.config import Config, Paths
from localfab.textsafe import visible_controls
from localfab.tui import textual_fixes
from localfab.tui.backend import ChatBackend
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.sessions import SessionStore
from localfab.tui.themes import DEFAULT_DARK, load_themes
from localfab.tui.widgets.keymap import binding_ids, check_keymap

if TYPE_CHECKING:
    # The models, fit and settings screens (and the GGUF reader and planner behind them) load
    # when first opened: the first frame does not wait for them.
    from localfab.gguf.facts import ModelFacts
    from localfab.plan import Wishes
    from localfab.tui.models import ModelSource
    from localfab.tui.screens.fit import FitScreen
    from localfab.tui.screens.models import ModelsScreen
    from localfab.tui.screens.settings import SettingsScreen

textual_fixes.apply()

# Keys by action id: a mapping, or (id, keys) pairs as config.toml's [keys] table gives them.
KeymapSpec = Mapping[str, str] | Sequence[tuple[str, str]]


@dataclass(frozen=True)
class AppDeps:
    """What the app is built from: the chat's backend and history, where models come from,
    how to read a model's header, the settings and where they live, and how it looks."""

    history: History
    backend: ChatBackend | None = None
    model_name: str | None = None
    session_id: int | None = None  # a saved chat to open
    system: str | None = None  # the system prompt of a new chat
    theme: str | None = None
    themes_dir: Path | None = None
    clock_now: float | None = None  # a fixed "now" for snapshots; None: the real clock
    keymap: KeymapSpec | None = None
    notices: tuple[str, ...] = ()  # shown once the app is up (a broken config file, ...)
    models: ModelSource | None = None
    backend_factory: Callable[..., ChatBackend] | None = None
    facts_for: Callable[[str], ModelFacts] | None = None
    config: Config | None = None
    paths: Paths | None = None


class LocalfabApp(App[None]):
    """Chat with local models."""

    CSS_PATH = "localfab.tcss"
    TITLE = "localfab"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        # Off the footer (it is in the palette and Settings), so that 80 columns show Models.
        Binding("ctrl+t", "next_theme", "Theme", id="app.theme", show=False),
        Binding("ctrl+o", "models", "Models", id="app.models"),
        Binding("f4", "fit", "Fit", id="app.fit", show=False),
        Binding("f9", "settings", "Settings", id="app.settings", show=False),
    ]

    def __init__(self, deps: AppDeps) -> None:
        super().__init__()
        # Fit and settings: how to read a model's header, the settings and where they are saved.
        self.facts_for = deps.facts_for
        self.config = deps.config or Config()
        self.paths = deps.paths
        self.start_notices = deps.notices
        self.models = deps.models
        self.backend_factory = deps.backend_factory
        self.backend = deps.backend
        self.history = deps.history
        self.session_store = SessionStore(deps.history)
        self.model_name = deps.model_name
        self.start_session = deps.session_id
        self.system = deps.system
        self.clock_now = deps.clock_now  # a fixed "now" for snapshots; None: the real clock
        theme, keymap = deps.theme, deps.keymap
        loaded = load_themes(deps.themes_dir)
        self.theme_problems = loaded.problems
        self.localfab_themes = [t.name for t in loaded.themes]
        for t in loaded.themes:
            self.register_theme(t)
        wanted = theme or DEFAULT_DARK
        if wanted not in self.available_themes and theme:
            self.theme_problems += (f"theme {theme!r} is not installed: using {DEFAULT_DARK}",)
            wanted = DEFAULT_DARK  # a missing or refused theme: the app's own, not Textual's
        if wanted in self.available_themes:
            self.theme = wanted
        self.key_problems: tuple[str, ...] = ()
        self.remapped_keys: frozenset[str] = frozenset()  # keys the user gave to actions
        if keymap:
            pairs = keymap.items() if isinstance(keymap, Mapping) else keymap
            checked = check_keymap(pairs, binding_ids())
            self.key_problems = checked.problems
            self.set_keymap(checked.keys)
            self.remapped_keys = frozenset(
                key.strip() for keys in self._keymap.values() for key in keys.split(",")
            )

    def on_mount(self) -> None:
        self.push_screen(
            ChatScreen(
                self.backend,
                model_name=self.model_name,
                session_id=self.start_session,
                system=self.system,
            )
        )
        if self.backend is None and self.models is not None:
            from localfab.tui.screens.models import ModelsScreen

            self.push_screen(ModelsScreen(self.models))
        for problem in self.theme_problems:
            self.notify(problem, title="Theme", severity="warning", timeout=8)
        for problem in self.key_problems:
            self.notify(problem, title="Keys (config.toml)", severity="warning", timeout=12)
        for notice in self.start_notices:
            self.notify(notice, severity="error", timeout=15)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """A toast that shows its text literally, whatever `markup` says (widgets' and screens'
        `notify` pass it on as True): the app writes no markup, and its notes carry servers'
        errors, file names and config values, where `[/x]` would end the app and
        `[@click=app.quit]` would be an action link. This method is thread-safe, as Textual's."""
        del markup
        super().notify(
            visible_controls(message),
            title=visible_controls(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    @property
    def chat(self) -> ChatScreen:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("no chat screen")

    def action_next_theme(self) -> None:
        names = self.localfab_themes or [DEFAULT_DARK]
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"Theme: {self.theme}", timeout=2)

    def action_models(self) -> None:
        from localfab.tui.screens.models import ModelsScreen

        if self.models is None or isinstance(self.screen, ModelsScreen):
            return
        self.push_screen(ModelsScreen(self.models))

    def action_fit(self) -> None:
        """The fit screen for the model under the cursor on the models screen, else this one."""
        from localfab.plan import Wishes
        from localfab.tui.screens.fit import FitScreen
        from localfab.tui.screens.models import ModelsScreen

        if self.facts_for is None or isinstance(self.screen, FitScreen):
            return
        name = self.model_name
        if isinstance(self.screen, ModelsScreen):
            from textual.widgets import DataTable

            table = self.screen.query_one(DataTable)
            if table.row_count:
                key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
                name = str(key) if key is not None else name
        if not name:
            self.notify("Choose a model first (Ctrl+O lists them).", severity="warning")
            return
        facts_for = self.facts_for
        base = Wishes(min_ctx=self.config.min_ctx, flash_attn=self.config.flash_attn)
        self.push_screen(FitScreen(name, lambda: facts_for(name), base=base))

    def action_settings(self) -> None:
        from localfab.tui.screens.settings import SettingsScreen

        if isinstance(self.screen, SettingsScreen):
            return
        self.push_screen(SettingsScreen(self.config, self.paths, themes=self.localfab_themes))

    # Handlers by name (on_<screen>_<message>): the screens' modules load when first opened.
    def on_settings_screen_saved(self, event: SettingsScreen.Saved) -> None:
        self.config = event.config
        self.notify("Settings saved; generation settings apply to the next model opened.")

    async def on_fit_screen_load_requested(self, event: FitScreen.LoadRequested) -> None:
        await self.chat_with(event.model, wishes=event.wishes)

    async def on_models_screen_model_chosen(self, event: ModelsScreen.ModelChosen) -> None:
        await self.chat_with(event.name)

    async def chat_with(self, name: str, *, wishes: Wishes | None = None) -> None:
        """Close the current model and open a chat on `name` (planned with `wishes`, if any)."""
        if self.backend_factory is None:
            self.notify("This app cannot open other models.", severity="warning")
            return
        old = self.chat
        await old.stop_for_exit()
        if old.backend is not None:
            old.backend.close()
        if wishes is None:
            self.backend = self.backend_factory(name)
        else:
            self.backend = self.backend_factory(name, wishes=wishes)
        self.model_name = name
        while not isinstance(self.screen, ChatScreen) and len(self.screen_stack) > 1:
            await self.pop_screen()
        await self.switch_screen(ChatScreen(self.backend, model_name=name, system=self.system))

    async def action_quit(self) -> None:
        with contextlib.suppress(LookupError):
            await self.chat.stop_for_exit()
        self.exit()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, ChatScreen):
            chat = screen
            yield SystemCommand("New chat", "Start a new chat", chat.action_new_chat)
            yield SystemCommand("Stop reply", "Stop the streaming reply", chat.action_stop)
            yield SystemCommand(
                "Continue reply", "Continue a cut or stopped reply", chat.action_continue_reply
            )
            yield SystemCommand(
                "Copy code",
                "Copy the code block under the mouse, or the last one",
                chat.action_copy_code,
            )
            yield SystemCommand("Chats", "Show or hide saved chats", chat.action_toggle_sessions)
            yield SystemCommand(
                "Search chats", "Full-text search of saved chats", chat.action_search
            )
            yield SystemCommand(
                "Export chat", "Save a chat as Markdown or JSON", chat.action_export_chat
            )
            yield SystemCommand(
                "Import chat", "Add a chat from a JSON export", chat.action_import_chat
            )
            yield SystemCommand("Copy reply", "Copy the last reply", chat.action_copy_reply)
            yield from thinking_commands(chat)
            yield SystemCommand("Cancel load", "Cancel the model load", chat.action_cancel_load)
        if self.models is not None:
            yield SystemCommand("Models", "Local models and their fit", self.action_models)
        if self.facts_for is not None:
            yield SystemCommand("Fit", "How a model fits, here or on a profile", self.action_fit)
        yield SystemCommand("Settings", "Theme, generation defaults, threads", self.action_settings)
        yield SystemCommand("Next theme", "Switch to the next theme", self.action_next_theme)


def thinking_commands(chat: ChatScreen) -> Iterable[SystemCommand]:
    """A thinking model's commands: the thought shown or hidden, the chat's thinking."""
    from localfab.tui.screens.chat_thinking import PALETTE_BUDGETS, budget_words

    yield SystemCommand(
        "Show/hide thought", "Unfold or fold the last reply's thought", chat.action_toggle_thought
    )
    yield SystemCommand(
        "Thinking on/off",
        "A thinking model thinks, or not, in this chat",
        chat.action_toggle_thinking,
    )
    for budget in PALETTE_BUDGETS:
        yield SystemCommand(
            f"Thinking budget: {budget_words(budget)}",
            "How long a thinking model may think in this chat",
            partial(chat.set_thinking_budget, budget),
        )


def make_app(deps: AppDeps) -> LocalfabApp:
    """The app, built the same way for the CLI, the tests and the benchmark; the theme, when
    none is given, from LOCALFAB_THEME."""
    theme = deps.theme or os.environ.get("LOCALFAB_THEME") or None
    return LocalfabApp(replace(deps, theme=theme))
