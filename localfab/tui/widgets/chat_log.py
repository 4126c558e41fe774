"""The conversation as the chat screen shows it: one scrolling column of messages.

`ChatLog` shows a stored chat (its messages, a divider where old turns left the window), finds
what to copy (the last reply, the code block under the mouse), and scrolls a search hit into
view once it is laid out.
"""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets.markdown import MarkdownFence

from localfab.tui.backend import StoredTurn
from localfab.tui.widgets.messages import MessageView, fence_at
from localfab.tui.widgets.sessions import ResumeDivider
from localfab.tui.widgets.tool_cards import stored_tool_cards
from localfab.tui.widgets.versions import ChatMessage


class ChatLog(VerticalScroll):
    """The chat's messages, newest at the bottom, following the end while a reply streams."""

    async def show(
        self,
        shown: list[StoredTurn],
        *,
        welcome: str,
        resume_at: int | None = None,
        left: int = 0,
    ) -> list[ChatMessage | None]:
        """Replace what is shown with `shown` (the welcome text when it is empty); a divider
        before `shown[resume_at]` says `left` turns left the window. Returns the view of each
        turn (None for an empty one)."""
        await self.remove_children()
        if not shown:
            await self.mount(Static(welcome, id="welcome", markup=False))
        placed: list[ChatMessage | None] = []
        widgets: list[Widget] = []
        for t in shown:
            view = None
            if (t.content or t.reasoning or t.images) and t.role != "tool":
                view = ChatMessage(
                    t.role,
                    t.content,
                    status=t.status,
                    message_id=t.message_id,
                    version=t.version,
                    versions=t.versions,
                    reasoning=t.reasoning,
                    images=t.images,
                )
                widgets.append(view)
            placed.append(view)
            widgets.extend(stored_tool_cards(t.role, t.content, t.tools))
        await self.mount_all(widgets)
        if resume_at is not None and left:
            # Old turns stayed on screen but left the window when the chat was rebuilt.
            first = next((v for v in placed[resume_at:] if v), None)
            if first is not None:
                await self.mount(ResumeDivider(left), before=first)
        return placed

    async def drop_welcome(self) -> None:
        for welcome in self.query("#welcome"):
            await welcome.remove()

    def last_reply_text(self) -> str | None:
        """The text of the last reply that has any (as far as it has streamed)."""
        views = [v for v in self.query(MessageView) if v.role == "assistant" and v.text]
        return views[-1].text if views else None

    def code_to_copy(self, *near: Widget | None) -> str | None:
        """The code of the block under or holding one of `near` (the mouse, the focus), else
        of the last block; None when there is none."""
        fences = list(self.query(MarkdownFence))
        if not fences:
            return None
        fence = next((f for f in map(fence_at, near) if f in fences), fences[-1])
        view = next(a for a in fence.ancestors if isinstance(a, MessageView))
        return view.code_of(fence)

    def reveal(self, view: Widget, tries: int = 100) -> None:
        """Scroll `view` to the top once it has been laid out: a chat opened from the search
        screen is not laid out while that screen is on top."""
        if not view.is_attached:
            return
        if not view.virtual_region.height and tries > 0:
            self.set_timer(0.02, lambda: self.reveal(view, tries - 1))
            return
        view.scroll_visible(animate=False, top=True)
