"""A large paste into the prompt box: it lands whole, is wrapped once per width, and its rows are
drawn exactly as a stock TextArea draws them, without cutting a long line into every row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.document._wrapped_document import WrappedDocument
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

from localfab.chat.history import History
from localfab.tui.widgets.prompt import PromptBox
from tests.tui_support import build_app, loaded, wait_for

pytestmark = pytest.mark.anyio

SENTENCE = "The quick brown fox jumps over the lazy dog,\tagain and again, until the end. "


def pasted_text() -> str:
    """About 200 KB: many short lines, then one long line with tabs and a control character."""
    lines = "".join(f"{i}: {SENTENCE}\n" for i in range(1500))
    return lines + SENTENCE * 1000 + "\x07 bell"


async def test_a_large_paste_lands_whole_and_is_wrapped_once_per_width(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = pasted_text()
    wraps: list[int] = []
    original = WrappedDocument.wrap

    def wrap(self: WrappedDocument, width: int, tab_width: int | None = None) -> None:
        if len(self.document.text) == len(text):  # the box holding the paste, wrapped whole
            wraps.append(width)
        original(self, width, tab_width)

    monkeypatch.setattr(WrappedDocument, "wrap", wrap)
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await loaded(pilot, app)
        box = chat.query_one(PromptBox)
        box.focus()
        await pilot.pause()
        app.post_message(events.Paste(text))  # as the terminal's bracketed paste arrives
        await wait_for(pilot, lambda: box.text == text)
        await pilot.pause()
        assert box.cursor_location == box.document.end
        assert box.show_vertical_scrollbar  # the paste overflowed the box: its width changed
        # The text is wrapped again only where the width changed, never twice at one width.
        assert len(wraps) == len(set(wraps)), wraps
        assert wraps == [box.wrap_width]


class Pair(App[None]):
    """A PromptBox and a stock TextArea side by side, the same size, holding the same text."""

    CSS = "TextArea { width: 40; height: 12; }"

    def compose(self) -> ComposeResult:
        yield PromptBox(id="prompt")
        yield TextArea(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", id="stock")


def rows(area: TextArea) -> list[list[tuple[str, object]]]:
    return [[(seg.text, seg.style) for seg in area.render_line(y)] for y in range(12)]


@pytest.fixture
def divides(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many rows each `Text.divide` made (rich's own, not the prompt box's)."""
    made: list[int] = []
    original = Text.divide

    def divide(self: Text, offsets: object) -> object:
        cuts = list(offsets)  # type: ignore[call-overload]
        made.append(len(cuts) + 1)
        return original(self, cuts)

    monkeypatch.setattr(Text, "divide", divide)
    yield made


@pytest.mark.parametrize(
    ("cursor", "selection"),
    [
        ((1, 0), None),  # at the start of the long line
        ((1, 4000), ((1, 3990), (1, 4030))),  # deep inside it, with a selection around
        ((2, 3), ((0, 5), (2, 2))),  # a selection over several lines, tabs included
    ],
)
async def test_rows_of_a_long_line_are_drawn_as_a_textarea_draws_them(
    cursor: tuple[int, int],
    selection: tuple[tuple[int, int], tuple[int, int]] | None,
    divides: list[int],
) -> None:
    text = "short first line\n" + SENTENCE * 60 + "\x07\nlast\tline"
    app = Pair()
    async with app.run_test(size=(90, 30)) as pilot:
        prompt, stock = app.query_one(PromptBox), app.query_one("#stock", TextArea)
        drawn: dict[str, list[list[tuple[str, object]]]] = {}
        for area in (prompt, stock):
            area.cursor_blink = False
            area.focus()  # each drawn focused, with its cursor
            area.load_text(text)
            area.move_cursor(cursor)
            if selection is not None:
                area.selection = Selection(*selection)
            area.scroll_cursor_visible()
            await pilot.pause()
            area._line_cache.clear()  # drawn afresh here, not taken from the last frame
            divides.clear()
            drawn[str(area.id)] = rows(area)
            if area is prompt:
                assert max(divides, default=0) <= 3  # no row cut the whole long line into rows
        assert prompt.scroll_offset == stock.scroll_offset
        assert prompt.cursor_screen_offset - prompt.region.offset == (
            stock.cursor_screen_offset - stock.region.offset
        )
        assert drawn["prompt"] == drawn["stock"]


def test_a_prompt_line_divides_like_rich_text() -> None:
    box = PromptBox()
    box.load_text("0123456789abcdefghij\tklmnopqrstuvwxyz")
    line = box.get_line(0)
    line.stylize("bold", 3, 12)
    line.stylize("red", 10, 11)
    line.stylize("underline", 0, len(line))
    line.stylize("italic", 19, 25)
    reference = Text(line.plain, end="", no_wrap=True, spans=list(line.spans))
    for offsets in ([], [5], [10, 20], [3, 11, 12, 19, 30], list(range(1, 37))):
        ours, theirs = line.divide(offsets), reference.divide(offsets)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert (a.plain, a.spans, a.style, a.justify, a.overflow) == (
                b.plain,
                b.spans,
                b.style,
                b.justify,
                b.overflow,
            )
        assert [t.plain for t in ours[1:3]] == [t.plain for t in theirs[1:3]]
        assert [t.plain for t in ours] == [t.plain for t in theirs]
