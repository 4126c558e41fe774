"""The chat log's pieces: messages (Markdown, streamed), shift dividers and reply footers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.errors import NoWidget
from textual.geometry import Region
from textual.highlight import highlight
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Label, Markdown, Static
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

from localfab.textsafe import visible_controls
from localfab.tui import previews
from localfab.tui.backend import ImageChip
from localfab.tui.clipboard import code_blocks
from localfab.tui.widgets.reply_markdown import ReplyMarkdown
from localfab.tui.widgets.thought import ThoughtBlock


def shift_text(turns: int, tokens: int) -> str:
    """The words of a shift divider."""
    noun = "turn" if turns == 1 else "turns"
    return f"{turns} {noun} ({tokens} tokens) left the window; the system prompt stayed"


def image_chips(labels: Sequence[str]) -> str:
    """Images as chips on one line ("▣ name · W×H"), their names' control characters shown."""
    return "  ".join(f"▣ {visible_controls(label)}" for label in labels)


class ShiftDivider(Static):
    """An inline line where old turns left the context window."""

    def __init__(self, turns: int, tokens: int) -> None:
        super().__init__(
            f"── {shift_text(turns, tokens)} ──", classes="shift-divider", markup=False
        )
        self.turns = turns
        self.tokens = tokens


def warm_up_highlighter() -> None:
    """Load the code highlighter's tables and a common lexer (about 30 ms, once per process)."""
    highlight("x = 1\n", language="python")


FREEZE_AFTER = 8  # top-level blocks the open segment holds before its finished ones freeze
# Parked segments next to each other merge up to this much text: a long reply's far past is a
# few widgets, and bringing one back into view re-renders a bounded amount.
PARK_MERGE_CHARS = 12_000


class ParkedSegment(Widget):
    """A frozen segment far from the view, kept as its text and its height.

    One widget with nothing inside stands in for the segment's blocks, so the blocks of a long
    reply that scrolled away cost nothing per frame. The first time it is painted (the user
    scrolled to it) it asks to be turned back into Markdown.
    """

    @dataclass
    class Shown(Message):
        """A parked segment came into view."""

        segment: ParkedSegment

    def __init__(self, source: str, height: int, *, segment_classes: str) -> None:
        super().__init__(classes="parked")
        self.source = source
        self.segment_classes = segment_classes
        self.styles.width = "1fr"
        self.styles.height = height
        self._asked = False

    @property
    def shown(self) -> bool:
        """Whether it was painted (and asked to be turned back into Markdown)."""
        return self._asked

    def render_lines(self, crop: Region) -> list[Strip]:
        if not self._asked:
            self._asked = True
            self.post_message(self.Shown(self))
        return super().render_lines(crop)


Part = Markdown | ParkedSegment


class ReplyDocument:
    """A message's Markdown read as one document, across its segments."""

    def __init__(self, parts: list[Part]) -> None:
        self.parts = parts

    @property
    def source(self) -> str:
        return "".join(part.source for part in self.parts)

    @property
    def children(self) -> list[Widget]:
        """The Markdown blocks on screen (parked segments have none), first to last."""
        return [b for part in self.parts if isinstance(part, Markdown) for b in part.children]


def split_point(blocks: Sequence[Widget]) -> int | None:
    """Where a segment's blocks can be cut so that the two halves render as the whole does.

    The last block is the open one (more text may still change it), so the cut is before it or
    earlier. Within one Markdown widget the gap between two blocks is the larger of their
    margins; across two segments it is their sum, so a cut is allowed only before a block with
    no top margin (a paragraph, list, table or rule; not a heading, quote or code block).
    """
    for k in range(len(blocks) - 1, 0, -1):
        if blocks[k].styles.margin.top == 0:
            return k
    return None


class MessageView(Vertical):
    """One message: who said it, and its text as Markdown (streamed for replies).

    A streaming reply is a column of Markdown segments. Only the last one, the open segment,
    takes new text; once it holds more than `FREEZE_AFTER` blocks, it is frozen with its
    finished blocks (never touched again) and a new open segment takes the rest; a frozen
    segment more than a screen away from the view is parked (see `ParkedSegment`). The cost of
    a batch of tokens therefore stays flat however long the reply grows, where one Markdown
    widget re-lays out and re-styles every block it holds for each batch.
    """

    # The segments stack as one document (structure, not looks).
    DEFAULT_CSS = """
    MessageView > .body {
        height: auto;
    }
    """

    def __init__(
        self,
        role: str,
        text: str = "",
        *,
        status: str = "complete",
        reasoning: str = "",
        images: tuple[ImageChip, ...] = (),
    ) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.images = images  # the images a user message carried
        self._initial = text
        # A thinking model's thought, above the answer (never in `text`, which copy copies).
        self.thought: ThoughtBlock | None = ThoughtBlock(reasoning) if reasoning else None
        self.status = status
        self.text = text
        self._stream_pending: list[str] = []
        self._stream_wake = asyncio.Event()
        self._stream_stopping = False
        self._stream_task: asyncio.Task[None] | None = None
        self._width = 0
        self._end_block: MarkdownBlock | None = None

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="role", markup=False)
        if self.images:
            yield Label(image_chips([i.label for i in self.images]), classes="images", markup=False)
            if previews.drawing():
                yield previews.ImagePreviews([i.picture for i in self.images])
        if self.thought is not None:
            yield self.thought
        with Vertical(classes="body"):
            yield ReplyMarkdown(visible_controls(self._initial), classes="segment")
        yield Label("", classes="reply-footer", markup=False)

    @property
    def segments(self) -> list[Markdown]:
        """The Markdown segments, first to last (one unless a long reply streamed)."""
        return list(self.query_one(".body", Vertical).query_children(Markdown))

    @property
    def parts(self) -> list[Part]:
        """The segments, parked or not, first to last."""
        body = self.query_one(".body", Vertical)
        return [p for p in body.children if isinstance(p, Markdown | ParkedSegment)]

    @property
    def markdown(self) -> ReplyDocument:
        return ReplyDocument(self.parts)

    def start_stream(self) -> None:
        """Begin streaming into this message (new text is appended, never re-rendered)."""
        if self._stream_task is None:
            self._stream_stopping = False
            self._stream_task = asyncio.create_task(self._stream_run(), name="message stream")
        # On the role label, not the message: a class change restyles the node it is on and all
        # below it, and below a long reply are all its blocks and table cells.
        self.query(".role").add_class("streaming")

    async def write_thought(self, text: str) -> None:
        """Append a batch of the thought (streamed above the answer until the answer starts)."""
        block = self.thought
        if block is None:
            block = self.thought = ThoughtBlock(live=True)
            await self.mount(block, after=self.query_one(".role"))
        block.append(text)

    def fold_thought(self, seconds: float | None = None, tokens: int | None = None) -> None:
        """The thought is over: fold it, with its figures where they are known."""
        if self.thought is not None:
            self.thought.finish(seconds=seconds, tokens=tokens)

    async def write(self, text: str) -> None:
        """Append a batch of text (one frame's worth of tokens)."""
        if not text:
            return
        if self.thought is not None and self.thought.live:
            self.thought.finish()  # the answer begins
        self.text += text
        if self._stream_task is None:
            self.start_stream()
        # Drawn with control characters made visible: model or stored text never sends an
        # escape sequence to the terminal (`text` keeps what was said, for copy and history).
        self._stream_pending.append(visible_controls(text))
        self._stream_wake.set()
        await asyncio.sleep(0)  # let the stream task take it

    async def end_stream(self) -> None:
        """Finish streaming: everything written is on screen when this returns."""
        if self._stream_task is not None:
            self._stream_stopping = True
            self._stream_wake.set()
            task, self._stream_task = self._stream_task, None
            await task
        self.query(".role").remove_class("streaming")

    async def _stream_run(self) -> None:
        """Append what was written, a batch at a time, freezing finished blocks as it goes."""
        while True:
            await self._stream_wake.wait()
            self._stream_wake.clear()
            text = "".join(self._stream_pending)
            self._stream_pending.clear()
            if text and self.is_attached:
                await self.segments[-1].append(text)
                await self._freeze_finished()
                self.mark_end()
                await self._park_far_segments()
            if self._stream_stopping and not self._stream_pending:
                return

    async def _freeze_finished(self) -> None:
        """Close the open segment at a block boundary; the blocks after it open a new segment.

        The finished blocks stay the widgets they are (nothing is parsed or mounted again): the
        open segment becomes the frozen one, gives up its blocks from the cut on, and a new open
        segment takes their text, parsed afresh (a block or two).
        """
        body = self.query_one(".body", Vertical)
        segment = self.segments[-1]
        blocks = list(segment.query_children(MarkdownBlock))
        if len(blocks) <= FREEZE_AFTER:
            return
        k = split_point(blocks)
        if k is None:
            return
        lines = segment.source.splitlines(keepends=True)
        cut = blocks[k].source_range[0]
        frozen, rest = "".join(lines[:cut]), "".join(lines[cut:])
        opened = ReplyMarkdown(classes="segment")
        with self.app.batch_update():
            await segment.remove_children(blocks[k:])
            # Its source: what its remaining blocks were parsed from. (No class marks it frozen:
            # a class change would restyle every block in it. Every segment but the last is.)
            segment._markdown = frozen
            await body.mount(opened, after=segment)
            await opened.update(rest)
        # The next append re-parses from where the open block (the last) starts, as it would
        # have in the old segment (`update` leaves this at the last line, inside that block).
        opened._last_parsed_line = segment._last_parsed_line - cut

    async def _park_far_segments(self) -> None:
        """Park the frozen segments that are more than a screen away from the view."""
        body = self.query_one(".body", Vertical)
        screen = self.screen
        for segment in self.segments[:-1]:
            try:
                geometry = screen.find_widget(segment)
            except NoWidget:  # not laid out yet
                continue
            region, clip = geometry.region, geometry.clip
            near = Region(clip.x, clip.y - clip.height, clip.width, clip.height * 3)
            if not region or near.overlaps(region):
                continue
            if self._park_into_previous(segment, region):
                await segment.remove()
                continue
            parked = ParkedSegment(
                segment.source,
                region.height,
                segment_classes=" ".join(sorted(segment.classes)),
            )
            with self.app.batch_update():
                await body.mount(parked, before=segment)
                await segment.remove()

    def _park_into_previous(self, segment: Markdown, region: Region) -> bool:
        """Add `segment` to the parked segment right above it, if there is one with room: one
        widget for the far past of a long reply, not one per segment (each costs a place in
        every layout pass)."""
        body = segment.parent
        if body is None:
            return False
        siblings = list(body.children)
        index = siblings.index(segment)
        above = siblings[index - 1] if index else None
        if not isinstance(above, ParkedSegment) or above.shown:
            return False
        if len(above.source) + len(segment.source) > PARK_MERGE_CHARS:
            return False
        try:
            top = self.screen.find_widget(above).region.y
        except NoWidget:
            return False
        above.source += segment.source
        above.styles.height = region.bottom - top  # the gap between them included
        return True

    async def _unpark(self, parked: ParkedSegment) -> None:
        body = self.query_one(".body", Vertical)
        if parked.parent is not body:
            return
        with self.app.batch_update():
            await body.mount(
                ReplyMarkdown(parked.source, classes=parked.segment_classes), before=parked
            )
            await parked.remove()

    @on(ParkedSegment.Shown)
    async def _parked_shown(self, event: ParkedSegment.Shown) -> None:
        event.stop()
        await self._unpark(event.segment)

    async def on_resize(self, event: events.Resize) -> None:
        # Parked heights hold for the width they were measured at: bring them all back.
        if event.size.width != self._width:
            self._width = event.size.width
            for part in self.parts:
                if isinstance(part, ParkedSegment):
                    await self._unpark(part)

    def mark_end(self) -> None:
        """Class the message's last block `-end` (the stylesheet takes its bottom margin).

        A class and not `:last-child`: any order rule makes Textual restyle every sibling (and
        their blocks) each time a block is mounted, which is every frame of a streaming reply.
        """
        blocks = self.segments[-1].query_children(MarkdownBlock) if self.is_attached else None
        last = blocks.last() if blocks else None
        if last is self._end_block:
            return
        if self._end_block is not None:
            self._end_block.remove_class("-end")
        if last is not None:
            last.add_class("-end")
        self._end_block = last

    def on_markdown_table_of_contents_updated(self) -> None:
        # Posted when a segment's blocks were (re)built: at mount, after update().
        self.mark_end()

    def set_footer(self, text: str, *, kind: str = "") -> None:
        footer = self.query_one(".reply-footer", Label)
        footer.update(text)
        footer.set_class(bool(text), "shown")
        for name in ("cut", "stopped", "failed"):
            footer.set_class(kind == name, name)

    def code_of(self, fence: MarkdownFence) -> str:
        """The exact source of one of this message's code blocks (the widget strips its end)."""
        for segment in self.segments:
            fences = list(segment.query(MarkdownFence))
            if fence in fences:
                sources = code_blocks(segment.source)
                if len(sources) == len(fences):
                    return sources[fences.index(fence)]
        return fence.code  # mid-stream, the widget may hold fewer blocks than the text


def fence_at(node: DOMNode | None) -> MarkdownFence | None:
    """The code block `node` is in (the widget under the mouse, or the focused one), if any."""
    while node is not None:
        if isinstance(node, MarkdownFence):
            return node
        node = node.parent
    return None
