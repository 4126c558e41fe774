"""Modal dialogs: an error with its reason and fix, and a one-line text question."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static


class ErrorDialog(ModalScreen[None]):
    """Says what went wrong and what to do; the app stays usable behind it."""

    BINDINGS = [Binding("escape,enter", "dismiss_dialog", "Close", id="dialog.close")]

    def __init__(self, title: str, reason: str) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error-dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.reason, classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("OK", variant="primary", id="ok")

    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        self.dismiss(None)

    def action_dismiss_dialog(self) -> None:
        self.dismiss(None)


class TextDialog(ModalScreen[str | None]):
    """Asks for one line of text (a chat's new title); None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, id="dialog-input")
            with Horizontal(classes="dialog-buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        self.dismiss(self.query_one(Input).value)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
