"""The prompt box: multi-line, Enter sends, Ctrl+J adds a line, Up/Down walk earlier prompts.

A large paste shows without a long wait: the box wraps a text once per width, and draws a row of
a long line without cutting the whole line into rows (see `PromptBox`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import overload

from rich.containers import Lines
from rich.control import strip_control_codes
from rich.text import Span, Text
from textual import events
from textual.binding import Binding
from textual.document._wrapped_document import WrappedDocument
from textual.message import Message
from textual.widgets import TextArea

from localfab.tui.image_paths import pasted_path


class _Rows(Lines):
    """A line cut at `offsets`, each piece made when it is looked at, as `Text.divide` makes it
    (same text, style and spans)."""

    def __init__(self, line: Text, offsets: list[int]) -> None:
        super().__init__()
        self._line = line
        self._plain = line.plain
        bounds = [0, *offsets, len(self._plain)]
        self._ranges = list(zip(bounds, bounds[1:], strict=False))

    def __len__(self) -> int:
        return len(self._ranges)

    def __iter__(self) -> Iterator[Text]:
        return (self._row(i) for i in range(len(self._ranges)))

    @overload
    def __getitem__(self, index: int) -> Text: ...

    @overload
    def __getitem__(self, index: slice) -> list[Text]: ...

    def __getitem__(self, index: int | slice) -> Text | list[Text]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self._ranges)))]
        return self._row(range(len(self._ranges))[index])  # IndexError as a list gives it

    def _row(self, i: int) -> Text:
        start, end = self._ranges[i]
        line = self._line
        row = Text(style=line.style, justify=line.justify, overflow=line.overflow)
        # The line's text lost its control codes when the line was made, so a slice of it is set
        # as it is: cleaning each piece again was most of what dividing a long line cost.
        row._text = [self._plain[start:end]]
        row._length = end - start
        row._spans = [
            Span(max(0, s - start), min(e, end) - start, style)
            for s, e, style in line._spans
            if s < end and e > start
        ]
        return row


class _PromptWrapping(WrappedDocument):
    """The prompt box's wrapped view of its text, whose `get_sections` slices a line's text.

    `WrappedDocument.get_sections` (textual 8.x) makes a `Text` of every row of the line to
    return their strings, and the cursor's screen position is worked out through it after every
    edit and move: five times for a paste, a tenth of a second each for a 1 MB line.
    """

    def get_sections(self, line_index: int) -> list[str]:
        line = strip_control_codes(self.document[line_index])  # as `Text(line)` has it
        bounds = [0, *self.get_offsets(line_index), len(line)]
        return [line[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


class _PromptLine(Text):
    """A line of the prompt box whose `divide` makes only the pieces asked for.

    `TextArea` draws each screen row of a wrapped line by dividing the whole line into all its
    rows and keeping one (textual 8.x `TextArea._render_line`): a row of a pasted 1 MB line
    made some 13,000 `Text` objects, a screenful ten times that.
    """

    __slots__ = ()

    def divide(self, offsets: Iterable[int]) -> Lines:
        return _Rows(self, list(offsets))


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

    @dataclass
    class ImagePath(Message):
        """A paste (or a file dropped on the terminal) named an image file: attach it."""

        prompt: PromptBox
        path: str

    @dataclass
    class DropLastImage(Message):
        """Backspace in an empty box: take the last attached image off."""

        prompt: PromptBox

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

    def _set_document(self, text: str, language: str | None) -> None:
        super()._set_document(text, language)
        if type(self.wrapped_document) is WrappedDocument:  # not a class Textual changed
            self.wrapped_document.__class__ = _PromptWrapping  # the same object, faster rows

    def get_line(self, line_index: int) -> Text:
        """The line as `TextArea.get_line` gives it, cut into rows lazily (`_PromptLine`)."""
        return _PromptLine(self.document.get_line(line_index), end="", no_wrap=True)

    def _rewrap_and_refresh_virtual_size(self) -> None:
        """`TextArea`'s, without wrapping the text again at the width it is wrapped at.

        TextArea wraps the whole text on every resize and whenever its scrollbar comes or goes
        (textual 8.x): a paste that grows the box and brings the scrollbar wrapped a 1 MB text
        three times, twice at one width. Edits keep the wrapping in step with the text, so at
        an unchanged width and tab width wrapping again would give what is already there.
        """
        wrapped = self.wrapped_document
        at = (getattr(wrapped, "_width", None), getattr(wrapped, "_tab_width", None))
        if at != (self.wrap_width, self.indent_width):
            super()._rewrap_and_refresh_virtual_size()
            return
        self._line_cache.clear()
        self._refresh_size()

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
        if event.key == "backspace" and not self.text:
            self.post_message(self.DropLastImage(self))
        if event.key in ("up", "down") and self._walking():
            event.stop()
            event.prevent_default()
            self._step(-1 if event.key == "up" else 1)
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        """A pasted path of an image file (what a terminal gives for a dropped file) attaches
        the image; any other paste is text (TextArea's own handler, which runs after this one
        unless the default is prevented)."""
        if pasted_path(event.text) is not None:
            event.stop()
            event.prevent_default()
            self.post_message(self.ImagePath(self, event.text.strip()))

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
