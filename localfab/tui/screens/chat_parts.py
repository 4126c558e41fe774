"""The chat screen's pieces that need no screen: inbox items, stored turns as shown, footers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

from localfab.tui.backend import (
    ChatBackend,
    ReplyContinued,
    ReplyEvent,
    ReplyFinished,
    StoredTurn,
    ToolCallWriting,
)
from localfab.tui.plain import escaped, palette_name, plain
from localfab.tui.widgets.messages import MessageView
from localfab.units import format_ms as duration

if TYPE_CHECKING:
    from localfab.chat.history import History
    from localfab.tui.sessions import DeletedSession, SessionStore


class AppServices(Protocol):
    """What the chat screen uses of its app (`LocalfabApp`): the history and the clock."""

    history: History
    session_store: SessionStore
    clock_now: float | None  # a fixed "now" for snapshots; None: the real clock


# A reply to stream: given the cancel event, the backend's events.
ReplyJob = Callable[[threading.Event], Iterator[ReplyEvent]]


def merge_continued(turns: list[StoredTurn]) -> list[StoredTurn]:
    """Stored turns with a continued reply shown once.

    A continuation is stored as a new assistant message holding the whole reply so far; the
    earlier, shorter copy is not shown.
    """
    out: list[StoredTurn] = []
    for turn in turns:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.role == turn.role == "assistant"
            and turn.content.startswith(prev.content)
        ):
            out[-1] = turn
        else:
            out.append(turn)
    return out


def shown_index(turns: list[StoredTurn], index: int) -> int:
    """Where stored turn `index` is in `merge_continued(turns)` (a continuation is its reply)."""
    shown = -1
    last: StoredTurn | None = None
    for i, turn in enumerate(turns):
        merged = (
            last is not None
            and last.role == turn.role == "assistant"
            and turn.content.startswith(last.content)
        )
        if not merged:
            shown += 1
        last = turn
        if i == index:
            return shown
    raise IndexError(index)


def reply_footer(done: ReplyFinished) -> tuple[str, str]:
    """The line under a finished reply, and its kind."""
    stats = (
        f"{done.completion_tokens} tokens · {done.tokens_per_second:,.1f} tok/s · "
        f"TTFT {duration(done.ttft_ms)}"
    )
    if done.continues:
        stats += f" · continued {done.continues}×"
    if done.prompt_note:
        stats += f" · {done.prompt_note}"
    if done.finish_reason == "length":
        return f"{stats} · ✂ cut at the token limit: ctrl+r continues", "cut"
    if done.finish_reason == "cancelled":
        return f"{stats} · ■ stopped: ctrl+r continues", "stopped"
    return stats, ""


class ChatHost(Screen[None]):
    """What the chat screen's parts (`SessionActions`, `VersionActions`) use of the screen.

    `ChatScreen` defines each of these; the parts live in their own modules to keep the screen
    readable, and inherit this so that they are typed against the screen they belong to.
    """

    backend: ChatBackend | None
    system: str | None
    loaded: bool
    streaming: bool
    _panel_user_set: bool
    _reply: MessageView | None
    _deleted: DeletedSession | None
    _search_notice_shown: bool

    @property
    def lf_app(self) -> AppServices:
        return self.app  # type: ignore[return-value]

    def refresh_sessions(self) -> None:
        raise NotImplementedError

    def _open(self, session_id: int | None, *, message_id: int | None = None) -> None:
        raise NotImplementedError

    def _start_reply(self, job: ReplyJob) -> None:
        raise NotImplementedError

    def _show_context(self) -> None:
        raise NotImplementedError

    async def _show_turns(
        self,
        turns: list[StoredTurn],
        *,
        highlight: int | None = None,
        window_start: int | None = None,
    ) -> None:
        raise NotImplementedError


def progress_note(item: ReplyContinued | ToolCallWriting) -> str:
    """What a streaming reply's footer says while it is continued or writes a tool call."""
    if isinstance(item, ToolCallWriting):
        return f"writing a call of {item.name} ({item.count})…"
    return f"continuing ({item.count}/{item.limit})…"


class ListedCommands(Provider):
    """A command palette provider over a list of (name, help, callback) from `_commands`."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        raise NotImplementedError

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(
                    score,
                    palette_name(matcher, name),
                    callback,
                    text=name,
                    help=escaped(help_text),
                )

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(plain(name), callback, text=name, help=escaped(help_text))
