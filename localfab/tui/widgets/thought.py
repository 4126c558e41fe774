"""A thinking model's thought, above its answer: streamed live, folded once the answer begins.

While the model thinks, the block shows a header ("Thinking… 3.2 s") and the last lines of the
thought, so the screen's cost per frame stays flat however long the thought grows. When the
answer starts (or the reply ends), the block folds to one line saying how long the thought took
and how many tokens it used; a click, or Enter on the focused block, unfolds the whole thought
(F3 or alt+t on the chat screen: the last reply's). The thought is plain text, drawn with control
characters made visible, and never part of what "copy reply" copies.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import Static

from localfab.textsafe import visible_controls
from localfab.units import format_ms

# While streaming, the folded view shows this many of the thought's last lines.
TAIL_LINES = 4


def thought_header(seconds: float | None, tokens: int | None, *, open_: bool, live: bool) -> str:
    """The block's first line: "▸ Thought for 3.2 s · 120 tokens" (▾ when unfolded)."""
    mark = "▾" if open_ else "▸"
    if live:
        took = "" if seconds is None else f" {format_ms(seconds * 1e3)}"
        return f"{mark} Thinking…{took}"
    figures = []
    if seconds is not None:
        figures.append(f"for {format_ms(seconds * 1e3)}")
    if tokens:
        figures.append(f"{tokens:,} tokens")
    return f"{mark} Thought" + (" " + " · ".join(figures) if figures else "")


def tail_of(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `text` (what a live, folded block shows)."""
    parts = text.rstrip("\n").split("\n")
    return "\n".join(parts[-lines:])


class ThoughtBlock(Static, can_focus=True):
    """The thought of one reply (see the module's docstring)."""

    DEFAULT_CSS = """
    ThoughtBlock {
        height: auto;
        color: $text-muted;
        padding: 0 0 0 1;
        border-left: vkey $foreground 20%;
        margin: 0 0 1 0;
    }
    ThoughtBlock:focus {
        background: $boost;
    }
    """

    BINDINGS = [Binding("enter,space", "fold", "Show/hide thought", show=False)]

    def __init__(self, text: str = "", *, tokens: int | None = None, live: bool = False) -> None:
        super().__init__("", classes="thought", markup=False)
        self.text = text
        self.tokens = tokens
        self.live = live
        self.open = False
        self.started = time.monotonic()
        self.seconds: float | None = None

    def on_mount(self) -> None:
        self.redraw()

    def append(self, text: str) -> None:
        """More of the thought, as it streams."""
        self.text += text
        self.redraw()

    def finish(self, *, seconds: float | None = None, tokens: int | None = None) -> None:
        """The thought is over (the answer began, or the reply ended): fold it, with its
        figures (`seconds`: as the backend measured it, else since the block appeared; the
        reply's end brings the measured ones)."""
        if self.live:
            self.live, self.open = False, False
            self.seconds = time.monotonic() - self.started
        if seconds is not None:
            self.seconds = seconds
        if tokens:
            self.tokens = tokens
        self.redraw()

    def action_fold(self) -> None:
        self.open = not self.open
        self.redraw()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.action_fold()

    def redraw(self) -> None:
        seconds = time.monotonic() - self.started if self.live else self.seconds
        header = thought_header(seconds, self.tokens, open_=self.open, live=self.live)
        body = ""
        if self.open:
            body = self.text.strip("\n")
        elif self.live:
            body = tail_of(self.text)
        shown = Text(header, style="bold")
        if body:
            shown.append("\n" + visible_controls(body), style="italic")
        self.update(shown)
