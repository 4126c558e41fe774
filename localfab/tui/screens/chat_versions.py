"""The chat screen's message versions: regenerate a reply, edit a prompt, switch versions.

A mixin of `ChatScreen` (its methods take the screen as `self`). Regenerating a reply or
editing a prompt stores a new version of that place in the chat (nothing is deleted): the
messages after it leave the screen, the new version streams like any reply (Esc stops it,
Ctrl+R continues it, quitting saves it as interrupted). Switching versions runs in a worker,
since the backend rebuilds the context window (the KV cache keeps the shared prefix), then the
chat is shown again along the chosen path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual import work
from textual.containers import VerticalScroll
from textual.message import Message

from localfab.errors import LocalfabError
from localfab.tui.backend import ReportsWindow, StoredTurn
from localfab.tui.screens.chat_parts import ChatHost, ListedCommands
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.versions import ChatMessage

EDIT_TITLE = "Editing a message: Enter sends it as a new version · Esc cancels"


@dataclass
class VersionSwitched(Message):
    """Another version of a message is now the chat's current path."""

    turns: list[StoredTurn]
    focus: int  # the place (among the shown messages) of the message that switched
    window_start: int | None = None


class VersionActions(ChatHost):
    """Regenerate, edit and switch versions, as the chat screen offers them."""

    _editing: ChatMessage | None = None
    _user_view: ChatMessage | None = None

    # --- which message ---------------------------------------------------------------------------

    def chat_messages(self) -> list[ChatMessage]:
        """The messages on screen, first to last."""
        return list(self.query_one("#chat-log", VerticalScroll).query(ChatMessage))

    def _target(self, role: str) -> ChatMessage | None:
        """The focused message of `role`, else the last one."""
        if isinstance(self.focused, ChatMessage) and self.focused.role == role:
            return self.focused
        views = [v for v in self.chat_messages() if v.role == role]
        return views[-1] if views else None

    def _can_change(self) -> bool:
        if not self.loaded:
            self.notify("Load a model first.", severity="warning")
            return False
        if self.streaming:
            self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return False
        return True

    async def _cut_from(self, view: ChatMessage) -> None:
        """Take `view` and everything after it off the screen (it stays stored)."""
        log = self.query_one("#chat-log", VerticalScroll)
        children = list(log.children)
        if view in children:
            await log.remove_children(children[children.index(view) :])
        self._reply = None

    # --- regenerate ------------------------------------------------------------------------------

    async def action_regenerate(self) -> None:
        """A new version of the focused reply, else of the last one."""
        await self._regenerate(self._target("assistant"))

    async def on_chat_message_regenerate_requested(
        self, event: ChatMessage.RegenerateRequested
    ) -> None:
        await self._regenerate(event.view)

    async def _regenerate(self, view: ChatMessage | None) -> None:
        if not self._can_change():
            return
        if view is None or view.role != "assistant":
            self.notify("There is no reply to regenerate yet.", severity="warning")
            return
        if view.message_id is None:
            self.notify(
                "This reply was not saved, so it has no versions: send the message again.",
                severity="warning",
            )
            return
        self._cancel_edit()
        backend = self.backend
        assert backend is not None
        message_id = view.message_id
        await self._cut_from(view)
        self._user_view = None
        self._reply = ChatMessage("assistant", status="generating")
        await self.query_one("#chat-log", VerticalScroll).mount(self._reply)
        self._reply.start_stream()
        self._start_reply(lambda cancel: backend.regenerate(message_id, cancel=cancel))

    # --- edit ------------------------------------------------------------------------------------

    def action_edit_message(self) -> None:
        """Put the focused prompt (else the last one) in the prompt box to edit."""
        self._begin_edit(self._target("user"))

    def on_chat_message_edit_requested(self, event: ChatMessage.EditRequested) -> None:
        self._begin_edit(event.view)

    def _begin_edit(self, view: ChatMessage | None) -> None:
        if not self._can_change():
            return
        if view is None or view.role != "user":
            self.notify("There is no message of yours to edit yet.", severity="warning")
            return
        if view.message_id is None:
            self.notify("This message is not saved, so it cannot be edited.", severity="warning")
            return
        self._editing = view
        prompt = self.query_one(PromptBox)
        prompt.load_text(view.text)
        prompt.border_title = EDIT_TITLE
        prompt.add_class("editing")
        prompt.focus()
        prompt.move_cursor(prompt.document.end)

    def _cancel_edit(self, *, clear: bool = False) -> bool:
        """Leave editing; returns whether a message was being edited."""
        if self._editing is None:
            return False
        self._editing = None
        prompt = self.query_one(PromptBox)
        prompt.border_title = None
        prompt.remove_class("editing")
        if clear:
            prompt.load_text("")
        return True

    async def _send_edit(self, text: str) -> None:
        """Send `text` as a new version of the message being edited."""
        view = self._editing
        backend = self.backend
        assert view is not None and view.message_id is not None and backend is not None
        message_id = view.message_id
        self._cancel_edit(clear=True)
        await self._cut_from(view)
        log = self.query_one("#chat-log", VerticalScroll)
        self._user_view = ChatMessage("user", text)
        self._reply = ChatMessage("assistant", status="generating")
        await log.mount_all([self._user_view, self._reply])
        self._reply.start_stream()
        self._start_reply(lambda cancel: backend.edit(message_id, text, cancel=cancel))

    # --- switching versions ----------------------------------------------------------------------

    def action_previous_version(self) -> None:
        """The focused message's older version (else the last reply's)."""
        self._switch(self._focused_or_last(), -1)

    def action_next_version(self) -> None:
        """The focused message's newer version (else the last reply's)."""
        self._switch(self._focused_or_last(), 1)

    def _focused_or_last(self) -> ChatMessage | None:
        if isinstance(self.focused, ChatMessage):
            return self.focused
        views = self.chat_messages()
        return views[-1] if views else None

    def on_chat_message_version_requested(self, event: ChatMessage.VersionRequested) -> None:
        self._switch(event.view, event.step)

    def _switch(self, view: ChatMessage | None, step: int) -> None:
        if view is None or not self._can_change():
            return
        if view.message_id is None or view.versions < 2:
            key = "r regenerates it" if view.role == "assistant" else "e edits it"
            self.notify(f"This message has one version: {key} into a new one.")
            return
        if not 1 <= view.version + step <= view.versions:
            self.notify("That is the oldest version." if step < 0 else "That is the newest one.")
            return
        self._cancel_edit()
        self._switch_worker(view.message_id, step, self.chat_messages().index(view))

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _switch_worker(self, message_id: int, step: int, place: int) -> None:
        backend = self.backend
        assert backend is not None
        try:
            turns = backend.switch_version(message_id, step)
        except (LocalfabError, ValueError, OSError) as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        start = backend.window_start if isinstance(backend, ReportsWindow) else None
        self.post_message(VersionSwitched(turns, place, start))

    async def on_version_switched(self, event: VersionSwitched) -> None:
        await self._show_turns(event.turns, window_start=event.window_start)
        self._show_context()
        self.refresh_sessions()
        views = self.chat_messages()
        if views:
            view = views[min(event.focus, len(views) - 1)]
            view.focus()
            self.call_after_refresh(view.scroll_visible, animate=False)

    # --- after a reply ---------------------------------------------------------------------------

    def label_new_messages(self) -> None:
        """Give the messages just sent and answered their stored ids and version counts.

        The last stored messages are matched to the last shown ones by role and text, so a
        reply that failed before it was stored is not taken for an older one.
        """
        if self.backend is None:
            return
        turns = self.backend.path()
        views = [v for v in (self._user_view, self._reply) if isinstance(v, ChatMessage)]
        for view, turn in zip(reversed(views), reversed(turns), strict=False):
            if view.role != turn.role or view.text != turn.content:
                break
            view.set_version(turn.message_id, turn.version, turn.versions)
        self._user_view = None

    # --- moving between messages -----------------------------------------------------------------

    def action_focus_messages(self) -> None:
        """Focus the last message, to act on it (←/→ versions, r regenerate, e edit)."""
        views = self.chat_messages()
        if views:
            views[-1].focus()
            views[-1].scroll_visible(animate=False)

    def on_chat_message_neighbour_requested(self, event: ChatMessage.NeighbourRequested) -> None:
        views = self.chat_messages()
        place = views.index(event.view) + event.step if event.view in views else -1
        if 0 <= place < len(views):
            views[place].focus()
            views[place].scroll_visible(animate=False)
        elif place >= len(views):
            self.query_one(PromptBox).focus()


class VersionCommands(ListedCommands):
    """The command palette's entries for message versions."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        screen = self.screen
        if not isinstance(screen, VersionActions):
            return []
        return [
            (
                "Regenerate reply",
                "A new version of the focused or last reply",
                screen.action_regenerate,
            ),  # fmt: skip
            (
                "Edit message",
                "Edit the focused or last prompt as a new version",
                screen.action_edit_message,
            ),  # fmt: skip
            (
                "Previous version",
                "Show the older version of a message",
                screen.action_previous_version,
            ),  # fmt: skip
            ("Next version", "Show the newer version of a message", screen.action_next_version),
            (
                "Focus messages",
                "Move to the messages (←/→ versions, r, e)",
                screen.action_focus_messages,
            ),  # fmt: skip
        ]
