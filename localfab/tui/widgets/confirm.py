"""A yes/no question before something that cannot be undone (removing a model's files)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from localfab.tui.plain import plain


class ConfirmDialog(ModalScreen[bool]):
    """Asks `question`; dismissed with True only when the user confirms (button or `y`)."""

    BINDINGS = [
        Binding("escape,n", "answer(False)", "Cancel", id="confirm.no"),
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
    ]

    def __init__(self, title: str, question: str, *, yes: str = "Remove") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error-dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.question, classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(plain(self.yes), variant="error", id="confirm-yes")
                yield Button("Cancel", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()  # the safe answer is the default

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
