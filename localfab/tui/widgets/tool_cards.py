"""Tool calls in the chat: a card that asks before a call runs, a card with what it returned,
and the screen that turns MCP servers on and off for a chat.

Everything a server or the model wrote is shown as plain text (never markup) with control
characters made visible, so a result cannot move the cursor, set the title or write the
clipboard.
"""

from __future__ import annotations

import json

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Collapsible, Input, Label, SelectionList, Static

from localfab.mcp.servers import split_name
from localfab.textsafe import visible_controls
from localfab.tui.backend import ToolCallShown, ToolResultShown, ToolServerRow
from localfab.tui.plain import escaped

# A result longer than this many lines starts folded.
FOLD_LINES = 6
RESULT_TITLES = {
    "result": "✓ {name} returned",
    "error": "✗ {name} failed",
    "denied": "⊘ {name} was denied",
    "timeout": "⏱ {name} timed out",
    "cancelled": "■ {name} was stopped",
    "crashed": "✗ {name}: the server failed",
}


def pretty_arguments(arguments: dict[str, object] | str) -> str:
    if isinstance(arguments, str):
        return visible_controls(arguments)
    return visible_controls(json.dumps(arguments, ensure_ascii=False, indent=2))


class ToolCallCard(Vertical, can_focus=True):
    """A call the model wants to make: tool, server, arguments, and the person's answer
    (y: allow once, a: always allow this tool, n: deny, with an optional reason)."""

    BINDINGS = [
        Binding("y", "decide('once')", "Allow once", id="tool.allow"),
        Binding("a", "decide('always')", "Always allow", id="tool.always"),
        Binding("n", "decide('deny')", "Deny", id="tool.deny"),
    ]

    class Decided(Message):
        def __init__(self, card: ToolCallCard, choice: str, reason: str) -> None:
            super().__init__()
            self.card, self.choice, self.reason = card, choice, reason

    def __init__(self, call: ToolCallShown, *, round_text: str = "", stored: bool = False) -> None:
        super().__init__(classes="tool-card tool-call")
        self.call = call
        self.round_text = round_text
        self.choice: str | None = "stored" if stored else None  # a reopened chat's: decided
        self.can_focus = not stored
        self.reason = ""  # why the person denied the call, if they said

    def compose(self) -> ComposeResult:
        server, tool = split_name(self.call.name)
        where = f" · {server}" if server else ""
        title = f"🔧 {tool}{where}  {self.round_text}".rstrip()
        yield Label(visible_controls(title), classes="tool-title", markup=False)
        yield Static(pretty_arguments(self.call.arguments), classes="tool-args", markup=False)
        if self.choice is not None:
            return
        with Horizontal(classes="tool-buttons"):
            yield Button("Allow once (y)", id="once", variant="primary", compact=True)
            yield Button("Always allow (a)", id="always", compact=True)
            yield Button("Deny (n)", id="deny", variant="error", compact=True)
        yield Input(placeholder="Why not? (optional, sent to the model with a denial)", id="reason")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_decide(event.button.id or "deny")

    @on(Input.Submitted, "#reason")
    def _reason_given(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_decide("deny")

    def action_decide(self, choice: str) -> None:
        if self.choice is not None:
            return
        self.choice = choice
        reason = self.query_one("#reason", Input).value.strip() if choice == "deny" else ""
        self.reason = reason
        self.query_one(".tool-buttons").remove()
        self.query_one("#reason").remove()
        said = {"once": "allowed once", "always": "always allowed", "deny": "denied"}[choice]
        note = f"{said}: {reason}" if reason else said
        self.mount(Label(visible_controls(note), classes=f"tool-decision {choice}", markup=False))
        self.can_focus = False
        self.post_message(self.Decided(self, choice, reason))

    def mark(self, text: str) -> None:
        """Show where the call is (running, cancelling)."""
        for label in self.query(".tool-decision").results(Label):
            label.update(visible_controls(text))


class ToolResultCard(Collapsible):
    """What a call returned: folded when long; the model reads the same text."""

    def __init__(self, name: str, result: ToolResultShown) -> None:
        _, tool = split_name(name)
        title = RESULT_TITLES.get(result.kind, "{name}").format(name=tool)
        if result.full_chars:
            title += f" (cut to fit: {result.full_chars:,} characters)"
        text = visible_controls(result.text) or "(nothing)"
        folded = text.count("\n") >= FOLD_LINES
        super().__init__(
            Static(text, classes="tool-output", markup=False),
            title=escaped(title),
            collapsed=folded,
            classes=f"tool-card tool-result {result.kind}",
        )
        self.result = result


def stored_tool_cards(role: str, content: str, tools: str) -> list[Vertical | Collapsible]:
    """The cards of a stored message (a reopened chat): an assistant's calls, or a result."""
    from localfab.chat.toolturns import stored_calls, stored_tools

    if role == "assistant":
        return [
            ToolCallCard(ToolCallShown(c.id, c.name, c.arguments), stored=True)
            for c in stored_calls(tools)
        ]
    if role == "tool":
        data = stored_tools(tools)
        result = ToolResultShown(content, str(data.get("kind", "result")))
        return [ToolResultCard(str(data.get("name", "tool")), result)]
    return []


class ToolsScreen(ModalScreen[list[str] | None]):
    """The MCP servers configured, their state and tools; pick the ones this chat uses."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="tools.cancel")]
    AUTO_FOCUS = "#tool-servers"

    def __init__(self, rows: list[ToolServerRow], *, problem: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.rows = rows
        self.problem = problem  # why the config's servers could not be read

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog tools-dialog"):
            yield Label("Tools for this chat (MCP servers)", classes="dialog-title", markup=False)
            if not self.rows:
                why = self.problem or (
                    "No MCP servers are configured. Add [mcp.servers.NAME] to config.toml, or "
                    "import Claude Desktop's file: localfab mcp import FILE"
                )
                yield Static(visible_controls(why), classes="dialog-body", markup=False)
            else:
                yield SelectionList[str](
                    *[(self._line(r), r.name, r.in_use) for r in self.rows], id="tool-servers"
                )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Use", variant="primary", id="tools-use")
                yield Button("Cancel", id="tools-cancel")

    @staticmethod
    def _line(row: ToolServerRow) -> Content:
        state = row.status + (f": {row.error}" if row.error else "")
        names = ", ".join(row.tools)
        names = names if len(names) <= 40 else names[:39] + "…"
        tools = f" · {len(row.tools)} tools: {names}" if row.tools else ""
        return Content(visible_controls(f"{row.name}  ({state}{tools})  {row.target}"))

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "tools-use":
            self.dismiss(None)
            return
        lists = self.query(SelectionList)
        self.dismiss(list(lists.first().selected) if lists else [])
