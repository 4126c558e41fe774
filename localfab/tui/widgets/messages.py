"""The chat log's pieces: messages (Markdown, streamed), shift dividers and reply footers."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.widgets import Label, Markdown, Static
from textual.widgets.markdown import MarkdownFence, MarkdownStream

from localfab.tui.clipboard import code_blocks


def shift_text(turns: int, tokens: int) -> str:
    """The words of a shift divider."""
    noun = "turn" if turns == 1 else "turns"
    return f"{turns} {noun} ({tokens} tokens) left the window; the system prompt stayed"


class ShiftDivider(Static):
    """An inline line where old turns left the context window."""

    def __init__(self, turns: int, tokens: int) -> None:
        super().__init__(f"── {shift_text(turns, tokens)} ──", classes="shift-divider")
        self.turns = turns
        self.tokens = tokens


class MessageView(Vertical):
    """One message: who said it, and its text as Markdown (streamed for replies)."""

    def __init__(self, role: str, text: str = "", *, status: str = "complete") -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self._initial = text
        self.status = status
        self._stream: MarkdownStream | None = None
        self.text = text

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="role")
        yield Markdown(self._initial, classes="body")
        yield Label("", classes="reply-footer")

    @property
    def markdown(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def start_stream(self) -> None:
        """Begin streaming into this message (new text is appended, never re-rendered)."""
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
        self.add_class("streaming")

    async def write(self, text: str) -> None:
        """Append a batch of text (one frame's worth of tokens)."""
        if not text:
            return
        self.text += text
        if self._stream is None:
            self.start_stream()
        assert self._stream is not None
        await self._stream.write(text)

    async def end_stream(self) -> None:
        """Finish streaming: everything written is on screen when this returns."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.remove_class("streaming")

    def set_footer(self, text: str, *, kind: str = "") -> None:
        footer = self.query_one(".reply-footer", Label)
        footer.update(text)
        footer.set_class(bool(text), "shown")
        for name in ("cut", "stopped", "failed"):
            footer.set_class(kind == name, name)

    def code_of(self, fence: MarkdownFence) -> str:
        """The exact source of one of this message's code blocks (the widget strips its end)."""
        fences = list(self.markdown.query(MarkdownFence))
        sources = code_blocks(self.text)
        if fence in fences and len(sources) == len(fences):
            return sources[fences.index(fence)]
        return fence.code  # mid-stream, the widget may hold fewer blocks than the text


def fence_at(node: DOMNode | None) -> MarkdownFence | None:
    """The code block `node` is in (the widget under the mouse, or the focused one), if any."""
    while node is not None:
        if isinstance(node, MarkdownFence):
            return node
        node = node.parent
    return None
