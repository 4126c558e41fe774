"""What the terminal app needs from a model, as a small interface (`ChatBackend`), and the
events and values it passes.

The app never calls the engine directly: it talks to a `ChatBackend`. `local_backend.LocalBackend`
runs a `ChatSession` over a model loaded in this process; a fake engine (`tests.fake_engine`)
stands in for llama.cpp in tests, and a later backend can stream from a remote OpenAI-compatible
server. Nothing here imports textual or llama_cpp.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from localfab.chat.history_images import Attachment
from localfab.errors import LoadCancelled
from localfab.mcp.servers import ServerExtraInfo as ServerExtra  # a server's prompt or resource

# Re-exported for the app: a cancelled model load, a server's prompt or resource, an image.
__all__ = ["Attachment", "LoadCancelled", "ServerExtra"]

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class LoadProgress:
    """One step of loading a model: what is happening and, where known, how far it is."""

    stage: str
    fraction: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class ModelCard:
    """What the status bar and the load screen show about a loaded model."""

    name: str
    path: str
    n_ctx: int
    gpu_layers: int
    total_layers: int
    plan: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    threads: int = 0  # the engine's decode threads (0: not known)
    remote: str = ""  # the server it runs on, by name or URL ("": this machine)


@dataclass(frozen=True)
class ImageChip:
    """An image on a message: its chip's words ("name · W×H") and its picture's source (the
    bytes attached, the stored file, or None where there is nothing to draw)."""

    label: str
    picture: bytes | Path | None = None


@dataclass(frozen=True)
class StoredTurn:
    """A message of a resumed session, as the chat view shows it."""

    role: str
    content: str
    status: str = "complete"
    message_id: int | None = None  # its row in the history, when stored
    version: int = 1  # which version of its place in the chat this is, from 1
    versions: int = 1  # how many versions its place has (edits, regenerated replies)
    reasoning: str = ""  # a thinking model's thought before the reply
    tools: str = ""  # tool calls (an assistant's) or a result (a tool message's), as stored
    images: tuple[ImageChip, ...] = ()  # the images a user message carried


@dataclass(frozen=True)
class ReplyText:
    """Text the model added to the reply (a few tokens); `thought`: to its thought, shown
    apart above the answer."""

    text: str
    tokens: int = 1
    thought: bool = False


@dataclass(frozen=True)
class WindowShifted:
    """Whole oldest turns left the context window; the system prompt stayed."""

    turns: int
    tokens: int
    reprocessed: bool = False


@dataclass(frozen=True)
class ReplyContinued:
    """The reply hit the token limit and is being continued automatically."""

    count: int
    limit: int


@dataclass(frozen=True)
class ToolCallShown:
    """A call a reply made: its id, the tool (`server__tool`) and its arguments."""

    id: str
    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class ToolResultShown:
    """What a call came to, as its card shows it: the text the model reads, and its kind
    (result, error, denied, timeout, cancelled, crashed); `full_chars`: its length before it
    was cut to fit the window (0: not cut)."""

    text: str
    kind: str = "result"
    full_chars: int = 0


@dataclass(frozen=True)
class ReplyFinished:
    """The end of a reply: why it stopped and how fast it was."""

    text: str
    finish_reason: str  # "stop", "length" (cut at the token limit) or "cancelled"
    completion_tokens: int
    ttft_ms: float
    tokens_per_second: float
    continues: int = 0
    joules_per_token: float | None = None  # where the machine reports power (see `energy`)
    draft_acceptance: float | None = None  # drafted tokens kept, with speculative decoding
    # How the prompt got into the cache when it took long or came from the prompt cache
    # ("7,912 tokens restored from cache in 0.3 s"); "" otherwise.
    prompt_note: str = ""
    notes: tuple[str, ...] = ()  # one-line notes since the last reply (the prompt cache's)
    # A thinking model's thought: its text (not in `text`), its tokens, and the time from its
    # first token to the answer's (None: the reply had no thought).
    reasoning: str = ""
    thought_tokens: int = 0
    thought_ms: float | None = None
    # The tool calls the reply made, each (id, name, arguments as a dict or the model's text);
    # the chat asks before any of them runs.
    tool_calls: tuple[ToolCallShown, ...] = ()


@dataclass(frozen=True)
class ToolCallWriting:
    """The model began writing a tool call (`count`: the reply's calls so far)."""

    name: str
    count: int


ReplyEvent = ReplyText | WindowShifted | ReplyContinued | ReplyFinished | ToolCallWriting
ProgressCallback = Callable[[LoadProgress], None]


class ChatBackend(Protocol):
    """A model the app can chat with.

    Every method but `context_usage` and `path` (small reads) runs in a worker.
    """

    def load(self, *, progress: ProgressCallback, cancel: threading.Event) -> ModelCard:
        """Load the model, reporting progress; raise `LoadCancelled` when `cancel` is set."""
        ...

    def open_session(self, *, session_id: int | None, system: str | None) -> list[StoredTurn]:
        """Start a new chat (None) or resume a stored one; returns the messages it holds."""
        ...

    @property
    def session_id(self) -> int | None:
        """The stored session the chat is written to."""
        ...

    def send(
        self, text: str, *, cancel: threading.Event, images: Sequence[Attachment] = ()
    ) -> Iterator[ReplyEvent]:
        """Send a user message (with `images`, for a model that reads them: `ReadsImages`)
        and stream the reply."""
        ...

    def run_reply(self, pump: Callable[[], None]) -> None:
        """Run `pump` where this backend generates, without waiting for it: it iterates one
        reply (`send`, `regenerate`, ...) and hands the events to the screen itself."""
        ...

    def continue_reply(self, *, cancel: threading.Event) -> Iterator[ReplyEvent]:
        """Continue the last reply from where it stopped."""
        ...

    def regenerate(
        self, message_id: int | None, *, cancel: threading.Event
    ) -> Iterator[ReplyEvent]:
        """Stream a new version of a reply (None: the last); the old one stays stored."""
        ...

    def edit(self, message_id: int, text: str, *, cancel: threading.Event) -> Iterator[ReplyEvent]:
        """Store `text` as a new version of a user message, and stream a reply to it."""
        ...

    def switch_version(self, message_id: int, step: int) -> list[StoredTurn]:
        """Show another version of a message (-1: previous, 1: next); returns the new path."""
        ...

    def path(self) -> list[StoredTurn]:
        """The chat's current path as stored, with each message's id and versions."""
        ...

    def context_usage(self) -> tuple[int, int]:
        """Tokens the chat holds in the window, and the window's size."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ReadsImages(Protocol):
    """A backend that says whether its model reads images (a vision projector is loaded)."""

    def reads_images(self) -> bool: ...


THINKING_MODES = ("auto", "on", "off")


@runtime_checkable
class ControlsThinking(Protocol):
    """A backend whose chat can turn a thinking model's thinking on or off (`THINKING_MODES`:
    auto is the template's default) and bound it (tokens; -1: no budget)."""

    def thinking(self) -> tuple[bool, str, int]:
        """Whether the loaded model's template thinks, this chat's mode and its budget."""
        ...

    def set_thinking(self, mode: str | None = None, budget: int | None = None) -> None: ...


@runtime_checkable
class ReportsWindow(Protocol):
    """A backend that says where a resumed chat's window starts (index in its stored turns)."""

    @property
    def window_start(self) -> int | None: ...


@dataclass(frozen=True)
class ToolServerRow:
    """A configured MCP server as the tools screen lists it."""

    name: str
    target: str  # its command line or URL (never its env or headers)
    status: str  # off, starting, ready, failed, stopped
    error: str = ""
    tools: tuple[str, ...] = ()  # its tools' names, once started
    in_use: bool = False  # this chat offers its tools to the model


@runtime_checkable
class UsesTools(Protocol):
    """A backend whose chat can call tools from MCP servers. Every method but `tool_servers`
    and `tool_rounds` runs in a worker."""

    def tool_servers(self) -> list[ToolServerRow]: ...

    @property
    def tools_problem(self) -> str:
        """Why the configured servers could not be read ("" when they could)."""
        ...

    def use_servers(self, names: list[str]) -> list[ToolServerRow]:
        """Offer the named servers' tools to this chat (starting them); [] turns tools off."""
        ...

    def tool_rounds(self) -> int:
        """The most rounds of calls one message may lead to."""
        ...

    def always_allowed(self, name: str) -> bool: ...

    def allow_always(self, name: str) -> None: ...

    def run_tool(self, call: ToolCallShown, cancel: threading.Event) -> ToolResultShown:
        """Run an approved call (not on the engine thread: the model stays free)."""
        ...

    def add_tool_result(self, call: ToolCallShown, result: ToolResultShown) -> None: ...

    def follow_up(self, *, last_round: bool, cancel: threading.Event) -> Iterator[ReplyEvent]:
        """The model's reply to the results (`last_round`: it may call no more tools)."""
        ...

    def server_extras(self) -> list[ServerExtra]:
        """The prompts and resources of the servers this chat uses."""
        ...

    def fetch_extra(self, extra: ServerExtra, arguments: dict[str, str]) -> str:
        """A prompt's text or a resource's contents (LocalfabError with why, if not)."""
        ...
