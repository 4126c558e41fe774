"""A chat message that knows its versions: focus it to regenerate, edit or switch versions.

Editing a prompt or regenerating a reply stores a new version of that place in the chat, and
the old one stays. A message with more than one version says which one it shows ("‹ 2/3 ›"
beside who wrote it); with the message focused, ←/→ switch versions, `r` regenerates a reply
and `e` puts a prompt back in the prompt box to edit. The keys post typed messages; the chat
screen does the work.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widgets import Label

from localfab.tui.backend import ImageChip
from localfab.tui.widgets.messages import MessageView


def version_text(version: int, versions: int) -> str:
    """The indicator of a message with several versions; empty for a single one."""
    return f"‹ {version}/{versions} ›" if versions > 1 else ""


class ChatMessage(MessageView):
    """A message in the chat log, focusable, with its stored id and version."""

    can_focus = True

    DEFAULT_CSS = """
    ChatMessage:focus {
        background: $accent 12%;
        background-tint: $accent 12%;
    }
    ChatMessage .versions {
        color: $text-muted;
        height: 1;
        display: none;
    }
    ChatMessage .versions.shown {
        display: block;
    }
    """

    BINDINGS = [
        Binding("left", "version(-1)", "Older version", id="message.previous_version"),
        Binding("right", "version(1)", "Newer version", id="message.next_version"),
        Binding("r", "regenerate", "Regenerate", id="message.regenerate"),
        Binding("e", "edit", "Edit", id="message.edit"),
        Binding("up", "neighbour(-1)", "Previous message", id="message.up", show=False),
        Binding("down", "neighbour(1)", "Next message", id="message.down", show=False),
    ]

    @dataclass
    class VersionRequested(Message):
        """The user asked for another version of this message (step -1 or 1)."""

        view: ChatMessage
        step: int

    @dataclass
    class RegenerateRequested(Message):
        """The user asked for a new version of this reply."""

        view: ChatMessage

    @dataclass
    class EditRequested(Message):
        """The user asked to edit this prompt."""

        view: ChatMessage

    @dataclass
    class NeighbourRequested(Message):
        """The user moved the focus to the message before (-1) or after (1) this one."""

        view: ChatMessage
        step: int

    def __init__(
        self,
        role: str,
        text: str = "",
        *,
        status: str = "complete",
        message_id: int | None = None,
        version: int = 1,
        versions: int = 1,
        reasoning: str = "",
        images: tuple[ImageChip, ...] = (),
    ) -> None:
        super().__init__(role, text, status=status, reasoning=reasoning, images=images)
        self.message_id = message_id
        self.version = version
        self.versions = versions

    def on_mount(self) -> None:
        self._show_versions()

    def set_version(self, message_id: int | None, version: int, versions: int) -> None:
        """The stored message this view shows, and which of how many versions it is."""
        self.message_id = message_id
        self.version = version
        self.versions = versions
        if self.is_mounted:
            self._show_versions()

    def _show_versions(self) -> None:
        text = version_text(self.version, self.versions)
        who = "You" if self.role == "user" else "Assistant"
        roles = self.query(".role").results(Label)
        role = next(roles, None)
        if role is not None:
            # Beside who wrote it, so the indicator costs no line of its own.
            role.update(Content.assemble(who, ("  " + text, "not bold") if text else ""))
            return
        labels = self.query(".versions").results(Label)
        label = next(labels, None)
        if label is None:
            label = Label("", classes="versions", markup=False)
            self.mount(label)
        label.update(text)
        label.set_class(bool(text), "shown")

    @property
    def indicator(self) -> str:
        return version_text(self.version, self.versions)

    def action_version(self, step: int) -> None:
        self.post_message(self.VersionRequested(self, step))

    def action_regenerate(self) -> None:
        self.post_message(self.RegenerateRequested(self))

    def action_edit(self) -> None:
        self.post_message(self.EditRequested(self))

    def action_neighbour(self, step: int) -> None:
        self.post_message(self.NeighbourRequested(self, step))
