"""The prompt box: multi-line, Enter sends, Ctrl+J adds a line, Up/Down walk earlier prompts."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptBox(TextArea):
    """Where the user writes. Most terminals send Enter for Shift+Enter, hence Ctrl+J."""

    BINDINGS = [
        Binding("ctrl+j", "newline", "New line", id="prompt.newline", show=False),
    ]

    @dataclass
    class Submitted(Message):
        """The user sent the text in the box."""

        prompt: PromptBox
        text: str

    def __init__(self, **kwargs: object) -> None:
        super().__init__(
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            **kwargs,  # type: ignore[arg-type]
        )
        self.earlier: list[str] = []
        self._walk: int | None = None  # index into `earlier` while walking it
        self.last_key_at = float("-inf")  # time.monotonic() of the last key pressed here

    def on_mount(self) -> None:
        self.release_keys(getattr(self.app, "remapped_keys", ()))

    def release_keys(self, keys: Iterable[str]) -> None:
        """Give up this box's own editing bindings on `keys` (ones the user gave to actions).

        The focused widget's bindings come first, so without this a key remapped in config.toml
        to, say, stop a reply would still cut text here (ctrl+x) and never reach its action.
        """
        table = self._bindings.key_to_bindings
        for key in keys:
            bindings = table.get(key, [])
            kept = [b for b in bindings if b.id == "prompt.newline"]
            if kept:
                table[key] = kept
            else:
                table.pop(key, None)

    def remember(self, text: str) -> None:
        if text.strip() and (not self.earlier or self.earlier[-1] != text):
            self.earlier.append(text)
        self._walk = None

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_key(self, event: events.Key) -> None:
        self.last_key_at = time.monotonic()  # the chat screen paints a key's echo first
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                self.post_message(self.Submitted(self, text))
            return
        if event.key in ("up", "down") and self._walking():
            event.stop()
            event.prevent_default()
            self._step(-1 if event.key == "up" else 1)
            return
        await super()._on_key(event)

    def _walking(self) -> bool:
        """Up/Down walk the earlier prompts in an empty box, or while one is shown unchanged."""
        if not self.earlier:
            return False
        if not self.text:
            return True
        return self._walk is not None and self.text == self.earlier[self._walk]

    def _step(self, direction: int) -> None:
        if self._walk is None:
            if direction > 0:
                return
            self._walk = len(self.earlier) - 1
        else:
            self._walk += direction
        if self._walk < 0:
            self._walk = 0
        if self._walk >= len(self.earlier):
            self._walk = None
            self.load_text("")
            return
        self.load_text(self.earlier[self._walk])
        self.move_cursor(self.document.end)
