"""The arguments of an MCP server's prompt, asked for before the prompt is fetched."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from localfab.textsafe import visible_controls
from localfab.tui.backend import ServerExtra


class PromptArgsScreen(ModalScreen[dict[str, str] | None]):
    """One field per argument of `extra` (a prompt); dismissed with the values, or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="prompt_args.cancel")]

    def __init__(self, extra: ServerExtra) -> None:
        super().__init__(classes="dialog-screen")
        self.extra = extra

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog tools-dialog"):
            title = f"Prompt {self.extra.name} from {self.extra.server}"
            yield Label(visible_controls(title), classes="dialog-title", markup=False)
            for name, required in self.extra.arguments:
                hint = f"{name}{'' if required else ' (optional)'}"
                yield Input(placeholder=visible_controls(hint), id=f"arg-{name}", name=name)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Insert", variant="primary", id="args-ok")
                yield Button("Cancel", id="args-cancel")

    def _values(self) -> dict[str, str]:
        return {str(i.name): i.value for i in self.query(Input) if i.value}

    @on(Input.Submitted)
    @on(Button.Pressed, "#args-ok")
    def _done(self) -> None:
        missing = [
            n for n, required in self.extra.arguments if required and not self._values().get(n)
        ]
        if missing:
            self.notify(f"Fill in {', '.join(missing)}.", severity="warning")
            return
        self.dismiss(self._values())

    @on(Button.Pressed, "#args-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
