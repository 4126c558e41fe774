"""`LocalBackend`: the app's `ChatBackend` over a model loaded in this process.

Nothing here imports textual or llama_cpp: loaders import the engine inside the worker that
calls them, after the first frame is painted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.chat.history_images import Attachment, ImageStore, refs_from
from localfab.errors import LoadCancelled, LocalfabError, UsageError
from localfab.tui.backend import (
    ImageChip,
    ModelCard,
    ProgressCallback,
    ReplyEvent,
    StoredTurn,
)
from localfab.tui.cache_notes import (
    IDLE_PERSIST_S,
    IDLE_SLACK,
    window_note,
)
from localfab.tui.engine_thread import EngineThread, on_engine, streamed_on_engine
from localfab.tui.reply_events import translate
from localfab.tui.tool_backend import DEFAULT_TOOL_ROUNDS, ToolUse

if TYPE_CHECKING:
    from localfab.chat.history import History, StoredMessage
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatSession
    from localfab.chat.tools import ToolRequest
    from localfab.engine.types import GenerationOptions, SamplingParams
    from localfab.ledger.writer import LedgerWriter, ReplyRecorder
    from localfab.mcp.approvals import Approvals
    from localfab.mcp.servers import ToolServers

log = logging.getLogger("localfab.tui")

__all__ = ["ChatModel", "ChatOptions", "LoadCancelled", "LocalBackend"]


@dataclass
class ChatModel:
    """What a loader hands to `LocalBackend`: an engine and its prompt builder."""

    engine: Any
    prompts: PromptBuilder
    info: ModelCard
    close: Callable[[], None] = lambda: None
    plan: Any = None  # the planner's Plan it was loaded with (for the usage ledger)
    # One-line notes of the prompt cache (a state file discarded, a full disk), shown with the
    # next reply; the loader's cache appends, the backend empties it.
    notes: list[str] = field(default_factory=list)
    # The remote server it runs on ("": this machine); its replies' energy is not this
    # machine's to measure, and the usage ledger records this machine's work only.
    remote: str = ""


Loader = Callable[[ProgressCallback, threading.Event], ChatModel]


@dataclass
class ChatOptions:
    """Per-session generation settings."""

    max_tokens: int = -1
    max_continues: int = 3
    sampling: SamplingParams | None = None
    reply_reserve: int | None = None
    # A thinking model: on, off or auto (the template's default), and the reasoning budget in
    # tokens (-1: none); the defaults of every chat, which the chat can change for itself.
    thinking: str = "auto"
    reasoning_budget: int = -1
    # With tools on: "auto" (the model decides) or "required" (every reply but a last
    # round's calls a tool, held by the grammar).
    tool_choice: str = "auto"

    def reply(self, cancel: threading.Event, budget: int | None = None) -> GenerationOptions:
        """What one reply asks of the engine, stopped by `cancel` (`budget`: the chat's own)."""
        from localfab.engine.types import GenerationOptions, SamplingParams

        return GenerationOptions(
            max_tokens=self.max_tokens,
            sampling=self.sampling or SamplingParams(),
            cancel=cancel,
            reasoning_budget=self.reasoning_budget if budget is None else budget,
        )


@dataclass
class LocalBackend(ToolUse):
    """A ChatSession over a model loaded in this process (or over a fake engine in tests).

    The model is loaded, and every reply generated, on the backend's one engine thread
    (see `localfab.tui.engine_thread`), whichever thread calls.
    """

    loader: Loader
    history: History | None
    model_name: str
    options: ChatOptions = field(default_factory=ChatOptions)
    # Where each reply's figures go (`localfab stats`); None records nothing. Energy is measured
    # either way, for the status bar.
    ledger: LedgerWriter | None = None
    ledger_file: Path | None = None  # opened (as `ledger`) by `load`, off the event loop
    _loaded: ChatModel | None = None
    _session: ChatSession | None = None
    _recorder: ReplyRecorder | None = None
    # What opening the current chat did with its window (restored from the prompt cache or
    # processed), told in the footer of its first reply.
    _opened: str = ""
    # Replies started: a chat is written to the prompt cache's disk tier once it has been idle
    # (no new reply) for `IDLE_PERSIST_S`.
    _activity: int = 0
    _idle_timer: threading.Timer | None = None
    _think_mode: str | None = None  # this chat's thinking, where it set its own
    _think_budget: int | None = None
    engine_thread: EngineThread = field(default_factory=EngineThread, repr=False)
    # MCP tool servers (None: none configured), the tools this chat offers, and approvals.
    servers: ToolServers | None = None
    approvals: Approvals | None = None
    max_tool_rounds: int = DEFAULT_TOOL_ROUNDS
    tools_problem: str = ""  # why the config's MCP servers could not be read ("": none)
    _tool_request: ToolRequest | None = None

    @on_engine
    def load(self, *, progress: ProgressCallback, cancel: threading.Event) -> ModelCard:
        loaded = self.loader(progress, cancel)
        if cancel.is_set():
            loaded.close()
            raise LoadCancelled()
        self._loaded = loaded
        from localfab.ledger.writer import Ledger, LedgerWriter, ReplyRecorder
        from localfab.machine.energy import EnergyMeter

        if loaded.remote:
            self._recorder = None
            return loaded.info
        if self.ledger is None and self.ledger_file is not None:
            self.ledger = LedgerWriter(Ledger(self.ledger_file))

        self._recorder = ReplyRecorder(
            self.ledger,
            frontend="chat",
            model=self.model_name,
            plan=loaded.plan,
            meter=EnergyMeter.for_this_machine(),
            model_path=loaded.info.path,
        )
        return loaded.info

    def _require(self) -> ChatModel:
        if self._loaded is None:
            raise RuntimeError("no model is loaded")
        return self._loaded

    @on_engine
    def open_session(self, *, session_id: int | None, system: str | None) -> list[StoredTurn]:
        from localfab.chat.session import ChatSession

        loaded = self._require()
        self._opened = ""
        self._think_mode = self._think_budget = None  # each chat starts from the defaults
        self._tool_request = None  # and without tools: each chat turns them on for itself
        if session_id is not None and self.history is not None:
            engine = loaded.engine
            before, started = getattr(engine, "restored", None), time.perf_counter()
            self._session = ChatSession.resume(
                self.history,
                session_id,
                loaded.engine,
                loaded.prompts,
                max_continues=self.options.max_continues,
                reply_reserve=self.options.reply_reserve,
            )
            restored = getattr(engine, "restored", None)
            self._opened = window_note(
                len(self._session.expected_cache),
                time.perf_counter() - started,
                restored if restored is not before else None,
            )
            return self.path()
        # The chat is stored from its first message on: an opened, unused chat leaves no trace.
        self._session = ChatSession(
            loaded.engine,
            loaded.prompts,
            system=system,
            max_continues=self.options.max_continues,
            reply_reserve=self.options.reply_reserve,
        )
        return []

    # --- thinking --------------------------------------------------------------------------------

    def thinking(self) -> tuple[bool, str, int]:
        """Whether the model's template thinks, and this chat's mode and budget."""
        from localfab.chat.thinking import template_caps

        loaded = self._loaded
        thinks = loaded is not None and template_caps(loaded.prompts.template)["supports_thinking"]
        mode = self._think_mode or self.options.thinking
        budget = self.options.reasoning_budget if self._think_budget is None else self._think_budget
        return thinks, mode, budget

    def set_thinking(self, mode: str | None = None, budget: int | None = None) -> None:
        """This chat's thinking (a new or reopened chat starts from the options' defaults)."""
        if mode is not None:
            self._think_mode = mode
        if budget is not None:
            self._think_budget = budget

    def _reply_options(self, cancel: threading.Event) -> GenerationOptions:
        """On the engine thread: a reply's options, with the chat's thinking put to the
        template (its enable_thinking; a template without one is kept from thinking by a
        budget of 0) and its budget."""
        from localfab.chat.thinking import template_caps

        _, mode, budget = self.thinking()
        self._offer_tools(self._chat())
        prompts = self._require().prompts
        if mode == "auto" or template_caps(prompts.template)["supports_enable_thinking"]:
            prompts.set_thinking(mode)
        elif mode == "off":
            budget = 0
        return self.options.reply(cancel, budget)

    @property
    def session_id(self) -> int | None:
        return None if self._session is None else self._session.session_id

    @property
    def window_start(self) -> int | None:
        """Index of the first stored message in the context window (a reopened long chat)."""
        return None if self._session is None else self._session.window_start

    def _chat(self) -> ChatSession:
        if self._session is None:
            self.open_session(session_id=None, system=None)
        assert self._session is not None
        return self._session

    def run_reply(self, pump: Callable[[], None]) -> None:
        # On the engine thread the reply's generator runs in place (no relay): its events go
        # from the thread that decodes straight to the screen's inbox.
        self.engine_thread.post(pump)

    @streamed_on_engine
    def send(
        self, text: str, *, cancel: threading.Event, images: Sequence[Attachment] = ()
    ) -> Iterator[ReplyEvent]:
        chat = self._chat()
        if chat.history is None and self.history is not None:
            chat.history = self.history
            chat.session_id = self.history.create_session(model=self.model_name, system=chat.system)
        events = chat.send(text, self._reply_options(cancel), images=images)
        yield from self._events(events)

    def reads_images(self) -> bool:
        """Whether the loaded model reads images (its vision projector is loaded)."""
        loaded = self._loaded
        return loaded is not None and getattr(loaded.engine, "projector", None) is not None

    @streamed_on_engine
    def continue_reply(self, *, cancel: threading.Event) -> Iterator[ReplyEvent]:
        chat = self._chat()
        events = chat.continue_reply(self._reply_options(cancel))
        yield from self._events(events)

    @streamed_on_engine
    def regenerate(
        self, message_id: int | None, *, cancel: threading.Event
    ) -> Iterator[ReplyEvent]:
        chat = self._chat()
        index = -1 if message_id is None else self._index(chat, message_id)
        events = chat.regenerate(index, self._reply_options(cancel))
        yield from self._events(events)

    @streamed_on_engine
    def edit(self, message_id: int, text: str, *, cancel: threading.Event) -> Iterator[ReplyEvent]:
        chat = self._chat()
        events = chat.edit(self._index(chat, message_id), text, self._reply_options(cancel))
        yield from self._events(events)

    def _events(self, events: Iterator[Any]) -> Iterator[ReplyEvent]:
        """A reply's events for the app, measured and recorded in the usage ledger."""
        opened, self._opened = self._opened, ""
        self._activity += 1
        notes = self._loaded.notes if self._loaded is not None else []
        recorder = self._recorder
        if recorder is not None:
            energy = lambda: recorder.energy  # noqa: E731
            events = recorder.wrap(events)
        else:
            energy = lambda: None  # noqa: E731
        yield from translate(events, energy=energy, opened=opened, notes=notes)
        self._persist_when_idle()

    def _persist_when_idle(self) -> None:
        """Write the chat's KV state to the prompt cache's disk tier once no reply has started
        for `IDLE_PERSIST_S` (a reopened chat, after a restart, is then restored, not processed)."""
        mark = self._activity

        def check() -> None:
            if self._activity == mark and not self.engine_thread.closed:
                self.engine_thread.post(lambda: self._persist(mark))

        if self._idle_timer is not None:
            self._idle_timer.cancel()  # the newest reply's timer is the one that counts
        timer = self._idle_timer = threading.Timer(IDLE_PERSIST_S, check)
        timer.daemon = True
        timer.start()

    def _persist(self, mark: int | None = None) -> None:
        """On the engine thread: the chat's state to disk (unless a reply started since)."""
        loaded = self._loaded
        if loaded is None or (mark is not None and mark != self._activity):
            return
        persist = getattr(loaded.engine, "persist_prompt", None)
        if persist is not None:
            try:
                # Gone idle: only when the chat grew by more than IDLE_SLACK tokens since its
                # last file (each write is the whole state); quitting writes it exactly.
                persist(0 if mark is None else IDLE_SLACK)
            except LocalfabError as exc:  # never breaks the app: the next open processes it
                log.warning("prompt cache: could not keep the chat's state (%s)", exc)

    @on_engine
    def switch_version(self, message_id: int, step: int) -> list[StoredTurn]:
        chat = self._chat()
        store = chat.history.images if chat.history is not None else None
        return [_turn(m, store) for m in chat.switch_version(self._index(chat, message_id), step)]

    def path(self) -> list[StoredTurn]:
        chat = self._session
        if chat is None or chat.history is None or chat.session_id is None:
            return []
        return [_turn(m, chat.history.images) for m in chat.history.messages(chat.session_id)]

    @staticmethod
    def _index(chat: ChatSession, message_id: int) -> int:
        """The place in the chat's current path of a stored message."""
        for index, stored in chat.stored_ids().items():
            if stored == message_id:
                return index
        raise UsageError("that message is not in this chat's current path: reopen the chat")

    def context_usage(self) -> tuple[int, int]:
        chat = self._session
        if chat is None:
            info = self._loaded.info if self._loaded else None
            return 0, info.n_ctx if info else 0
        # A remote's window is shown as its server's slot (a chat API's is counted in
        # characters here: shown in estimated tokens).
        scale = getattr(chat.engine, "chars_per_token", 1)
        total = getattr(chat.engine, "slot_ctx", 0) or chat.n_ctx // scale
        return len(chat.expected_cache) // scale, total

    def close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self.close_tools()
        self.engine_thread.call(self._close)
        self.engine_thread.shutdown()

    def _close(self) -> None:
        if self._loaded is not None:
            self._persist()  # the chat left open is restored, not processed, next time
            self._loaded.close()
            self._loaded = None
        self._session = None
        if self.ledger is not None:
            self.ledger.close()  # waits for the last rows (a few ms)
            self.ledger = None


def _turn(m: StoredMessage, store: ImageStore | None) -> StoredTurn:
    refs = refs_from(m.images)
    images = tuple(ImageChip(r.label(), store.path(r) if store else None) for r in refs)
    return StoredTurn(
        m.role, m.content, m.status, m.id, m.version, m.versions, m.reasoning, m.tools, images
    )
