"""The settings screen: theme, generation defaults and threads, saved to config.toml.

The theme applies as soon as it is picked. Values are checked by the same rules as config.toml
when it is read, so a value the app would refuse at start is refused here, with the reason.
Only the settings that changed are written; the rest of the file stays as it was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from localfab.config import Config, Paths, check_setting, save_settings
from localfab.errors import UsageError
from localfab.tui.plain import plain

# (setting, label) for the settings edited as text, in the order shown.
FIELDS: tuple[tuple[str, str], ...] = (
    ("ctx_size", "Default context (0: the planner chooses)"),
    ("max_tokens", "Max tokens per reply (-1: no limit)"),
    ("max_continues", "Auto-continue count"),
    ("temperature", "Temperature"),
    ("top_k", "Top-k"),
    ("top_p", "Top-p"),
    ("min_p", "Min-p"),
    ("threads", "Threads (0: one per physical core)"),
    ("thinking", "Thinking (on, off, auto)"),
    ("reasoning_budget", "Thinking budget (-1: no limit)"),
)
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


def hub_lines(env: Mapping[str, str]) -> str:
    """Where downloads come from and whether a token is set; never the token itself."""
    endpoint = env.get("HF_ENDPOINT") or f"{DEFAULT_HF_ENDPOINT} (default)"
    token = "set" if env.get("HF_TOKEN") else "not set"
    return f"HF_ENDPOINT: {endpoint}\nHF_TOKEN: {token}"


class SettingsScreen(Screen[None]):
    """Edit config.toml's settings from the app."""

    CSS_PATH = "settings.tcss"  # loaded when the screen first opens

    BINDINGS = [
        Binding("escape", "back", "Back", id="settings.back"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]

    @dataclass
    class Saved(Message):
        """The settings were written to config.toml; `config` is what it now holds."""

        config: Config

    def __init__(
        self,
        config: Config,
        paths: Paths | None,
        *,
        themes: list[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.paths = paths
        self.themes = themes
        self.env = os.environ if env is None else env
        self._initial_theme = ""

    def compose(self) -> ComposeResult:
        yield Label("Settings", id="settings-title", markup=False)
        with VerticalScroll(id="settings-form"):
            with Horizontal(classes="settings-row"):
                yield Label("Theme", classes="settings-label", markup=False)
                current = self._initial_theme = self.app.theme
                options = [(plain(t), t) for t in self.themes]
                if current not in self.themes:
                    options.insert(0, (plain(current), current))
                yield Select(
                    options, value=current, allow_blank=False, id="settings-theme", compact=True
                )
            for name, label in FIELDS:
                with Horizontal(classes="settings-row"):
                    yield Label(label, classes="settings-label", markup=False)
                    yield Input(
                        str(getattr(self.config, name)), id=f"settings-{name}", compact=True
                    )
            yield Static(hub_lines(self.env), id="settings-hub", markup=False)
            yield Static("", id="settings-problem", markup=False)
        with Horizontal(id="settings-actions"):
            yield Button("Save", id="settings-save", variant="primary", compact=True)
        yield Footer()

    @on(Select.Changed, "#settings-theme")
    def _theme_picked(self, event: Select.Changed) -> None:
        event.stop()
        if isinstance(event.value, str) and event.value in self.app.available_themes:
            self.app.theme = event.value

    def changes(self) -> dict[str, object]:
        """The settings whose field differs from the loaded config, checked; `UsageError` if not."""
        out: dict[str, object] = {}
        for name, _ in FIELDS:
            box = self.query_one(f"#settings-{name}", Input)
            value = check_setting(name, box.value, where=name)
            if value != getattr(self.config, name):
                out[name] = value
        theme = str(self.query_one("#settings-theme", Select).value)
        if theme != (self.config.theme or self._initial_theme):
            out["theme"] = theme
        return out

    @on(Button.Pressed, "#settings-save")
    def _save_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_save()

    def action_save(self) -> None:
        problem = self.query_one("#settings-problem", Static)
        try:
            changes = self.changes()
        except UsageError as exc:
            problem.update(str(exc))
            problem.add_class("-error")
            return
        if self.paths is None:
            problem.update("This app was started without a config folder: nothing to save to.")
            problem.add_class("-error")
            return
        if not changes:
            problem.update("Nothing changed.")
            problem.remove_class("-error")
            return
        try:
            self.config = save_settings(self.paths, changes)
        except (UsageError, OSError) as exc:
            problem.update(f"Not saved: {exc}")
            problem.add_class("-error")
            return
        problem.remove_class("-error")
        problem.update(f"Saved {', '.join(changes)} to {self.paths.config_file}.")
        self.post_message(self.Saved(self.config))

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
