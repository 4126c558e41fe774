"""The chat screen and a thinking model: the thought streamed above the reply, folded and
unfolded, and the chat's own thinking (on or off, a budget) from the command palette.

A mixin of `ChatScreen` (its methods take the screen as `self`).
"""

from __future__ import annotations

from localfab.tui.backend import ControlsThinking, ReplyFinished
from localfab.tui.reply_stream import Thought
from localfab.tui.screens.chat_parts import ChatHost
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.status import StatusBar
from localfab.tui.widgets.thought import ThoughtBlock

# The budgets the palette offers (tokens; -1: no limit).
PALETTE_BUDGETS = (-1, 256, 1024, 4096)


def budget_words(budget: int) -> str:
    return "no limit" if budget < 0 else f"{budget:,} tokens"


class ThinkingActions(ChatHost):
    """The thought of each reply, and the chat's thinking."""

    async def show_thought(self, item: Thought) -> None:
        """A batch of the streaming reply's thought."""
        if self._reply is not None:
            await self._reply.write_thought(item.text)

    def thought_finished(self, item: ReplyFinished, view: MessageView | None) -> None:
        """The reply ended: its thought folds with its figures, the status bar says how long
        it thought."""
        if item.thought_ms is None:
            self.query_one(StatusBar).show_thought(None)
            return
        if view is not None:
            view.fold_thought(item.thought_ms / 1e3, item.thought_tokens)
        self.query_one(StatusBar).show_thought(item.thought_ms)

    def action_toggle_thought(self) -> None:
        """Show or hide the thought of the focused reply, else of the last one with one."""
        focused = self.focused
        if isinstance(focused, ThoughtBlock):
            focused.action_fold()
            return
        views = [v for v in self.query(MessageView) if v.thought is not None]
        if isinstance(focused, MessageView) and focused.thought is not None:
            views = [focused]
        if not views or views[-1].thought is None:
            self.notify("No reply here has a thought to show.", severity="warning")
            return
        views[-1].thought.action_fold()

    def _thinking_backend(self) -> ControlsThinking | None:
        backend = self.backend
        if not isinstance(backend, ControlsThinking) or not self.loaded:
            self.notify("Load a model first.", severity="warning")
            return None
        if not backend.thinking()[0]:
            self.notify("This model's chat template does not think.", severity="warning")
            return None
        return backend

    def action_toggle_thinking(self) -> None:
        """Turn this chat's thinking off, or on again (from the next reply on)."""
        backend = self._thinking_backend()
        if backend is None:
            return
        mode = "on" if backend.thinking()[1] == "off" else "off"
        backend.set_thinking(mode)
        self.notify(f"Thinking is {mode} for this chat, from the next reply on.")

    def set_thinking_budget(self, budget: int) -> None:
        """Bound this chat's thinking to `budget` tokens (-1: no limit)."""
        backend = self._thinking_backend()
        if backend is None:
            return
        backend.set_thinking(budget=budget)
        self.notify(f"Thinking budget for this chat: {budget_words(budget)}.")
