"""The localfab terminal app and its factory, shared by the CLI, the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from localfab.chat.history import History
from localfab.tui.backend import ChatBackend
from localfab.tui.models import ModelSource
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.screens.models import ModelsScreen
from localfab.tui.sessions import SessionStore
from localfab.tui.themes import DEFAULT_DARK, load_themes

# System clipboard tools, tried in order after OSC 52.
CLIPBOARD_TOOLS = (
    ("wl-copy",),
    ("xclip", "-selection", "clipboard"),
    ("xsel", "--clipboard", "--input"),
    ("pbcopy",),
    ("clip.exe",),
)


class LocalfabApp(App[None]):
    """Chat with local models."""

    CSS_PATH = "localfab.tcss"
    TITLE = "localfab"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        Binding("ctrl+t", "next_theme", "Theme", id="app.theme"),
        Binding("ctrl+o", "models", "Models", id="app.models"),
    ]

    def __init__(
        self,
        *,
        backend: ChatBackend | None,
        history: History,
        model_name: str | None = None,
        session_id: int | None = None,
        system: str | None = None,
        theme: str | None = None,
        themes_dir: Path | None = None,
        clock_now: float | None = None,
        keymap: dict[str, str] | None = None,
        notices: tuple[str, ...] = (),
        models: ModelSource | None = None,
        backend_factory: Callable[[str], ChatBackend] | None = None,
    ) -> None:
        super().__init__()
        self.start_notices = notices
        self.models = models
        self.backend_factory = backend_factory
        self.backend = backend
        self.history = history
        self.session_store = SessionStore(history)
        self.model_name = model_name
        self.start_session = session_id
        self.system = system
        self.clock_now = clock_now  # a fixed "now" for snapshots; None: the real clock
        loaded = load_themes(themes_dir)
        self.theme_problems = loaded.problems
        self.localfab_themes = [t.name for t in loaded.themes]
        for t in loaded.themes:
            self.register_theme(t)
        wanted = theme or DEFAULT_DARK
        if wanted in self.available_themes:
            self.theme = wanted
        elif theme:
            self.theme_problems += (f"theme {theme!r} is not installed",)
        if keymap:
            self.set_keymap(keymap)

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
            self.push_screen(ModelsScreen(self.models))
        for problem in self.theme_problems:
            self.notify(problem, title="Theme", severity="warning", timeout=8)
        for notice in self.start_notices:
            self.notify(notice, severity="error", timeout=15)

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
        if self.models is None or isinstance(self.screen, ModelsScreen):
            return
        self.push_screen(ModelsScreen(self.models))

    @on(ModelsScreen.ModelChosen)
    async def _model_chosen(self, event: ModelsScreen.ModelChosen) -> None:
        await self.chat_with(event.name)

    async def chat_with(self, name: str) -> None:
        """Close the current model and open a chat on `name`."""
        if self.backend_factory is None:
            self.notify("This app cannot open other models.", severity="warning")
            return
        old = self.chat
        await old.stop_for_exit()
        if old.backend is not None:
            old.backend.close()
        self.backend = self.backend_factory(name)
        self.model_name = name
        while isinstance(self.screen, ModelsScreen):
            await self.pop_screen()
        await self.switch_screen(ChatScreen(self.backend, model_name=name, system=self.system))

    async def action_quit(self) -> None:
        with contextlib.suppress(LookupError):
            await self.chat.stop_for_exit()
        self.exit()

    def copy_text(self, text: str, *, what: str) -> None:
        """Copy byte-exact text: OSC 52 to the terminal, and the system clipboard if there is one.

        OSC 52 cannot report whether the terminal accepted it, so only a system clipboard tool
        that succeeded is reported as a copy.
        """
        self.copy_to_clipboard(text)
        for tool in CLIPBOARD_TOOLS:
            if shutil.which(tool[0]) is None:
                continue
            try:
                subprocess.run(tool, input=text.encode(), check=True, timeout=2)
            except (OSError, subprocess.SubprocessError):
                continue
            self.notify(f"Copied {what} ({len(text)} characters).")
            return
        self.notify(
            f"Sent {what} to the terminal's clipboard (OSC 52); no system clipboard tool was "
            "found, so it is pasted only if your terminal allows OSC 52.",
            severity="warning",
            timeout=6,
        )

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, ChatScreen):
            chat = screen
            yield SystemCommand("New chat", "Start a new chat", chat.action_new_chat)
            yield SystemCommand("Stop reply", "Stop the streaming reply", chat.action_stop)
            yield SystemCommand(
                "Continue reply", "Continue a cut or stopped reply", chat.action_continue_reply
            )
            yield SystemCommand("Chats", "Show or hide saved chats", chat.action_toggle_sessions)
            yield SystemCommand("Copy reply", "Copy the last reply", chat.action_copy_reply)
            yield SystemCommand("Cancel load", "Cancel the model load", chat.action_cancel_load)
        if self.models is not None:
            yield SystemCommand("Models", "Local models and their fit", self.action_models)
        yield SystemCommand("Next theme", "Switch to the next theme", self.action_next_theme)


def make_app(
    *,
    backend: ChatBackend | None,
    history: History,
    model_name: str | None = None,
    session_id: int | None = None,
    system: str | None = None,
    theme: str | None = None,
    themes_dir: Path | None = None,
    clock_now: float | None = None,
    keymap: dict[str, str] | None = None,
    notices: tuple[str, ...] = (),
    models: ModelSource | None = None,
    backend_factory: Callable[[str], ChatBackend] | None = None,
) -> LocalfabApp:
    """The app, built the same way for the CLI, the tests and the benchmark."""
    return LocalfabApp(
        backend=backend,
        history=history,
        model_name=model_name,
        session_id=session_id,
        system=system,
        theme=theme or os.environ.get("LOCALFAB_THEME") or None,
        themes_dir=themes_dir,
        clock_now=clock_now,
        keymap=keymap,
        notices=notices,
        models=models,
        backend_factory=backend_factory,
    )
