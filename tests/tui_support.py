"""The harness the TUI tests share: the app on the fake engine, and waiting for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.tui.app import AppDeps, KeymapSpec, LocalfabApp, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.sessions import SessionsPanel  # noqa: F401
from tests.fake_engine import FakeEngine, fake_loader

# A fixed "now" for the sessions panel in snapshots (2026-01-01).
FIXED_NOW = 1_767_225_600.0


def build_app(
    history: History,
    *,
    engine: FakeEngine | None = None,
    options: ChatOptions | None = None,
    fail: str | None = None,
    steps: int = 3,
    step_delay: float = 0.0,
    session_id: int | None = None,
    theme: str | None = None,
    themes_dir: Path | None = None,
    clock_now: float | None = None,
    keymap: KeymapSpec | None = None,
) -> tuple[LocalfabApp, FakeEngine]:
    engine = engine or FakeEngine()
    loader = fake_loader(engine, steps=steps, step_delay=step_delay, fail=fail)
    backend = LocalBackend(loader, history, "fake-model", options or ChatOptions())
    app = make_app(
        AppDeps(
            backend=backend,
            history=history,
            model_name="fake-model",
            session_id=session_id,
            theme=theme,
            themes_dir=themes_dir,
            clock_now=clock_now,
            keymap=keymap,
        )
    )
    return app, engine


async def wait_for(
    pilot: Pilot[None], condition: Callable[[], bool], *, seconds: float = 20
) -> None:
    """Let the app run until `condition()` holds; fail after `seconds`."""
    steps = int(seconds / 0.02)
    for _ in range(steps):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {condition}")


def palette_shows(app: LocalfabApp, text: str) -> bool:
    """Whether the command palette is open with `text` in its first (highlighted) hit."""
    from textual.command import CommandList, CommandPalette

    screen = app.screen
    if not isinstance(screen, CommandPalette):
        return False
    hits = screen.query_one(CommandList)
    if not hits.option_count:
        return False
    return text in str(hits.get_option_at_index(0).prompt)


def chat_screen(app: LocalfabApp) -> ChatScreen:
    return app.chat


def replies(app: LocalfabApp) -> list[MessageView]:
    return [v for v in app.chat.query(MessageView) if v.role == "assistant"]


async def loaded(pilot: Pilot[None], app: LocalfabApp) -> ChatScreen:
    await wait_for(pilot, lambda: app.screen_stack and isinstance(app.screen, ChatScreen))
    await wait_for(pilot, lambda: app.chat.loaded)
    return app.chat


async def send(pilot: Pilot[None], app: LocalfabApp, text: str) -> None:
    """Put `text` in the prompt box at the cursor, as a paste does, and press Enter. (Typing is
    tested key by key where keys are the point; a press per character costs a frame each.)"""
    chat = app.chat
    box = chat.query_one(PromptBox)
    box.focus()
    done = chat.replies_finished
    box.insert(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: chat.streaming or chat.replies_finished > done)


async def finished(pilot: Pilot[None], app: LocalfabApp) -> None:
    await wait_for(pilot, lambda: not app.chat.streaming)
    await pilot.pause()
