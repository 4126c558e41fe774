"""The Markdown widget of chat messages: Textual's, with tables drawn by one widget each.

Textual's Markdown table is a grid of one widget per cell. In a streaming reply every frame
lays the screen out again, and a few tables on screen (a dozen cells each) took a quarter of
that time, grid arrangement being the dearest layout Textual has. `ReplyTable` draws the same
table (column widths, wrapping, box lines and header style as Textual's) as a single widget, so
a table costs what a paragraph costs, and a row streamed into it redraws one widget.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal

from rich import box
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.style import Style
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock

# Not exported by textual.widgets.markdown; the mapping is its public way in.
_TextualTable: type[MarkdownBlock] = Markdown.BLOCKS["table_open"]
_HEADER: type[MarkdownBlock] = Markdown.BLOCKS["th_open"]
_ROW: type[MarkdownBlock] = Markdown.BLOCKS["tr_open"]
_CELL: type[MarkdownBlock] = Markdown.BLOCKS["td_open"]

Align = Literal["left", "center", "right"]


def rich_text(content: Content) -> Text:
    """Textual content as Rich text (measurable and wrappable, styles and links kept)."""
    text = Text()
    for segment in content.render_segments(Style(), ""):
        text.append(segment.text, segment.style)
    return text


def alignment(block: MarkdownBlock) -> Align:
    """A header cell's column alignment (`:--`, `:-:`, `--:`), left when none is given."""
    style = str(block._token.attrGet("style") or "")
    if "text-align:center" in style:
        return "center"
    if "text-align:right" in style:
        return "right"
    return "left"


def _flatten(block: MarkdownBlock) -> Iterator[MarkdownBlock]:
    for child in block._blocks:
        yield child
        yield from _flatten(child)


class ReplyTable(_TextualTable):  # type: ignore[misc,valid-type]
    """A Markdown table drawn as one widget."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"reply-table--header", "reply-table--lines"}

    DEFAULT_CSS = """
    ReplyTable {
        height: auto;
        & > .reply-table--header {
            color: $primary;
        }
        & > .reply-table--lines {
            color: $foreground 20%;
        }
    }
    """

    def __init__(self, markdown: Markdown, token: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(markdown, token, *args, **kwargs)
        self.headers: list[Content] = []
        self.rows: list[list[Content]] = []
        self.aligns: list[Align] = []

    def _read(self, blocks: Iterable[MarkdownBlock]) -> None:
        headers: list[Content] = []
        aligns: list[Align] = []
        rows: list[list[Content]] = []
        for block in blocks:
            if isinstance(block, _HEADER):
                headers.append(block._content)
                aligns.append(alignment(block))
            elif isinstance(block, _ROW):
                rows.append([])
            elif isinstance(block, _CELL) and rows:
                rows[-1].append(block._content)
        self.headers, self.aligns = headers, aligns
        self.rows = [row for row in rows if row]

    def compose(self) -> ComposeResult:
        self._read(_flatten(self))
        return iter(())

    def render(self) -> Table:
        table = Table(
            box=box.SQUARE,
            show_lines=True,
            expand=True,  # widths grow in proportion to fill the line, as in Textual's table
            padding=(0, 1),
            border_style=self.get_component_rich_style("reply-table--lines"),
            header_style=self.get_component_rich_style("reply-table--header"),
        )
        for header, align in zip(self.headers, self.aligns, strict=True):
            table.add_column(rich_text(header), justify=align, overflow="fold")
        for row in self.rows:
            table.add_row(*(rich_text(cell) for cell in row[: len(self.headers)]))
        return table

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        if isinstance(block, _TextualTable):
            self._read(_flatten(block))
            self.refresh(layout=True)
            return
        await MarkdownBlock._update_from_block(self, block)


class ReplyMarkdown(Markdown):
    """Markdown for chat messages (see the module's notes)."""

    BLOCKS = {**Markdown.BLOCKS, "table_open": ReplyTable}
