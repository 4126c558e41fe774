"""The model load as the chat screen shows it: stage, progress and plan, with a Cancel button.

The load runs in this widget's thread worker (the backend loads the model on its engine thread,
then opens the session, which rebuilds the KV cache) and ends in a `LoadPanel.Loaded` or
`LoadPanel.Failed` message for the screen.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Button, Label, ProgressBar, Static

from localfab.errors import LocalfabError
from localfab.tui.backend import (
    ChatBackend,
    LoadProgress,
    ModelCard,
    ReportsWindow,
    StoredTurn,
)
from localfab.tui.local_backend import LoadCancelled
from localfab.tui.widgets.messages import warm_up_highlighter


class LoadPanel(Vertical):
    """Shown while a model loads; hidden otherwise."""

    @dataclass
    class Progressed(Message):
        """The load moved on."""

        progress: LoadProgress

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, LoadPanel.Progressed)

    @dataclass
    class Loaded(Message):
        info: ModelCard
        turns: list[StoredTurn]
        window_start: int | None = None

    @dataclass
    class Failed(Message):
        reason: str
        cancelled: bool = False

    def __init__(self) -> None:
        super().__init__(id="load-panel")
        self.cancel = threading.Event()
        self.model_name = ""

    def compose(self) -> ComposeResult:
        yield Label("", id="load-stage", markup=False)
        yield ProgressBar(total=100, show_eta=False, id="load-bar")
        yield Static("", id="load-plan", markup=False)
        yield Button("Cancel load", id="load-cancel")

    def on_mount(self) -> None:
        self.display = False
        self.query_one("#load-cancel", Button).can_focus = False  # the prompt keeps the keys

    def start(
        self,
        backend: ChatBackend,
        model_name: str,
        *,
        session_id: int | None,
        system: str | None,
    ) -> None:
        """Show the panel and load `backend`'s model, then open the session."""
        self.model_name = model_name
        self.display = True
        self.query_one("#load-stage", Label).update(f"Loading {model_name}…")
        self._load(backend, session_id, system)

    def cancel_load(self) -> None:
        """Ask the load to stop (the loader checks between steps)."""
        self.cancel.set()
        self.query_one("#load-stage", Label).update("Cancelling…")

    @on(Button.Pressed, "#load-cancel")
    def _cancel_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.cancel_load()

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, backend: ChatBackend, session_id: int | None, system: str | None) -> None:
        def progress(step: LoadProgress) -> None:
            self.post_message(self.Progressed(step))

        try:
            info = backend.load(progress=progress, cancel=self.cancel)
            turns = backend.open_session(session_id=session_id, system=system)
        except LoadCancelled:
            self.post_message(self.Failed("the load was cancelled", cancelled=True))
            return
        except LocalfabError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        except Exception as exc:  # the app must outlive any failure of a model to load
            self.post_message(self.Failed(f"{type(exc).__name__}: {exc}"))
            return
        start = backend.window_start if isinstance(backend, ReportsWindow) else None
        self.post_message(self.Loaded(info, turns, start))
        warm_up_highlighter()  # here, not in the first reply's first code block

    @on(Progressed)
    def _progressed(self, event: Progressed) -> None:
        event.stop()
        p = event.progress
        self.query_one("#load-stage", Label).update(f"Loading {self.model_name}: {p.stage}")
        bar = self.query_one("#load-bar", ProgressBar)
        if p.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=round(100 * p.fraction))
        if p.detail:
            self.query_one("#load-plan", Static).update(p.detail)
