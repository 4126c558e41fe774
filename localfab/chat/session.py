"""ChatSession: a conversation that never stalls.

When the next turn would not fit in the context window, whole oldest turns leave it (the system
prompt and the latest user message always stay) and the KV cells of the kept turns are moved,
not re-processed. A reply that reaches the end of the window mid-generation makes room the same
way. A reply cut at the token limit is continued as a prefilled assistant turn, token for token,
so the pieces join without repeats. Every message is written to the history as it grows.

A reply can be regenerated and a user message edited: either way the new text is a new version
of that place in the conversation (a sibling in the history), the old one stays, and
`switch_version` moves between versions, rebuilding the window as `resume` does (the KV cache
keeps the prefix the two paths share).

Fitting the window is in `fitting`, the streamed events in `events`, and the streaming of one
reply (pieces, continuation, a shift mid-reply) in `replies`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from localfab.chat.events import FINISH_STATUS, ChatEvent, Continued, Reply, Shifted
from localfab.chat.fitting import (
    REPLY_RESERVE_FRACTION,
    fit_turns,
    next_turn_start,
    reply_reserve_for,
    reply_room,
)
from localfab.chat.history import History, StoredMessage
from localfab.chat.history_images import Attachment, attachments
from localfab.chat.images import (
    NOT_PLACED,
    count_images,
    image_message,
    restore_images,
    store_images,
    stored_images,
)
from localfab.chat.prompt import PromptBuilder
from localfab.chat.replies import FLUSH_SECONDS, ReplyStreaming
from localfab.chat.tools import ToolPlan, ToolRequest
from localfab.chat.toolturns import ToolCallMade, defang, result_json, with_tools
from localfab.engine import ChatEngine, GenerationOptions
from localfab.errors import ContextOverflow, UsageError

# What a reply asks for when the caller asks nothing: no limit, the default sampler chain.
NO_OPTIONS = GenerationOptions()

__all__ = [
    "FINISH_STATUS",
    "FLUSH_SECONDS",
    "REPLY_RESERVE_FRACTION",
    "ChatEvent",
    "ChatSession",
    "Continued",
    "Reply",
    "Shifted",
    "fit_turns",
    "next_turn_start",
    "reply_reserve_for",
    "reply_room",
]


class ChatSession(ReplyStreaming):
    """History, window, shift and continuation over one engine."""

    def __init__(
        self,
        engine: ChatEngine,
        prompts: PromptBuilder,
        *,
        system: str | None = None,
        max_continues: int = 3,
        reply_reserve: int | None = None,
        history: History | None = None,
        session_id: int | None = None,
        model_name: str = "",
    ) -> None:
        self.engine = engine
        self.prompts = prompts
        self.system = system
        # An engine that cannot go on with a cut reply (a remote chat API) is not asked to.
        self.max_continues = max_continues if getattr(engine, "continues", True) else 0
        self.n_ctx: int = engine.n_ctx
        self.reply_reserve = reply_reserve_for(self.n_ctx, reply_reserve)
        self.messages: list[dict[str, Any]] = []
        self.window_start = 0  # index in messages of the first message in the window
        self.history = history
        self.session_id = session_id
        if history is not None and session_id is None:
            self.session_id = history.create_session(model=model_name, system=system)
        # What the session believes the engine's KV cache holds after the last reply.
        self.expected_cache: list[int] = []
        # Replies as the model generated them: message index -> (content, tokens). Prompts use
        # these tokens rather than a re-tokenization of the text, which can split it otherwise.
        self._pins: dict[int, tuple[str, tuple[int, ...]]] = {}
        # Message index -> its row in the history, so a continued reply updates its own row.
        self._stored: dict[int, int] = {}
        self.tools: ToolRequest | None = None
        self.tool_plan: ToolPlan | None = None
        self.tool_system: str | None = None

    def _fit(self, last_user: int, reserve: int) -> tuple[int, list[int], int, int]:
        """Drop oldest turns until the window fits.

        Returns (start, tokens, turns dropped, tokens the unfitted window had).
        """
        return fit_turns(
            self.messages,
            self.window_start,
            last_user,
            lambda start: self._tokens(start, self.window(start)),
            self.n_ctx - reserve,
        )

    # --- a turn --------------------------------------------------------------------------------

    def send(
        self,
        text: str,
        options: GenerationOptions = NO_OPTIONS,
        images: Sequence[bytes | Attachment] = (),
    ) -> Iterator[ChatEvent]:
        """Add a user message and stream the reply (TokenEvents, Shifted, Continued, Reply);
        `images` (for a model with a vision projector) come before the text, stored with it."""
        return self._turn(text, options=options, images=images)

    def _turn(
        self,
        text: str,
        *,
        options: GenerationOptions,
        sibling_of: int | None = None,
        restore: Callable[[], None] | None = None,
        images: Sequence[bytes | Attachment] = (),
    ) -> Iterator[ChatEvent]:
        """A user message (a new version of stored message `sibling_of`, if given) and its reply.

        `restore` puts the conversation back as it was when the message does not fit.
        """
        last_user = len(self.messages)
        content, attached = text, attachments(images)
        if attached:  # the images' tokens pinned in their markers' places (`chat.images`)
            data = [a.data for a in attached]
            content, pinned = image_message(text, data, self.engine, self._plain)
            self._pins[last_user] = (content, tuple(pinned))
        self.messages.append({"role": "user", "content": content})
        reserve = reply_room(self.n_ctx, options.max_tokens, self.reply_reserve)
        start, tokens, dropped, n_before = self._fit(last_user, reserve)
        placed = not images or count_images(tokens) >= len(images)
        if len(tokens) >= self.n_ctx - 1 or not placed:
            self.messages.pop()
            self._pins.pop(last_user, None)
            if restore is not None:
                restore()
            if not placed:
                raise UsageError(NOT_PLACED)
            raise ContextOverflow(
                len(tokens),
                self.n_ctx,
                f"this message needs {len(tokens)} tokens with the system prompt, but the "
                f"context window holds {self.n_ctx}: shorten it or raise the context with -c",
            )
        if self.history is not None and self.session_id is not None:
            refs = store_images(self.history, attached)
            self._stored[last_user] = self.history.add_message(
                self.session_id, "user", text, sibling_of=sibling_of, images=refs
            )
        yield from self._answer(
            last_user,
            (start, tokens, dropped, n_before),
            options=options,
        )

    def _answer(
        self,
        last_user: int,
        fitted: tuple[int, list[int], int, int],
        *,
        options: GenerationOptions,
        sibling_of: int | None = None,
    ) -> Iterator[ChatEvent]:
        """Shift the window to `fitted` (from `_fit`) if it moved, then stream a new reply."""
        start, tokens, dropped, n_before = fitted
        shifts: list[Shifted] = []
        if dropped:
            shifts.append(self._shift(start, tokens, dropped, n_before - len(tokens)))
            yield shifts[-1]
        yield from self._reply(
            tokens,
            options=options,
            shifts=shifts,
            last_user=last_user,
            sibling_of=sibling_of,
        )

    def _plain(self, text: str) -> list[int]:
        return list(self.prompts.engine.tokenize(text, add_special=False, parse_special=False))

    # --- tools -------------------------------------------------------------------------------

    def set_tools(self, request: ToolRequest | None) -> None:
        """Offer `request`'s tools to the next replies (None: no tools). The template shows
        them (or the system prompt describes them, where it shows none), and a reply's calls
        are parsed, held to the tools' schemas, and kept with it (`Reply.tool_calls`)."""
        from localfab.chat.thinking import template_thinking
        from localfab.chat.tools import plan_tools, tool_messages

        self.tools, self.tool_plan, self.tool_system = request, None, None
        if request is None:
            self.prompts.variables.pop("tools", None)
            return
        template = self.prompts.template
        # Tool definitions come from third parties (MCP servers) and are rendered as template
        # text, where control tokens are read: theirs are made plain text.
        tools = defang(request.tools, self.prompts.holds_control_text)
        request = replace(request, tools=tools)
        head = [{"role": "system", "content": self.system}] if self.system else []
        shown = tool_messages(template, head, request)
        if shown and shown[0]["role"] == "system" and shown[0]["content"] != self.system:
            self.tool_system = str(shown[0]["content"])
        self.prompts.variables["tools"] = [dict(t) for t in request.tools]
        if request.choice != "none":
            thinking = template_thinking(template, "")
            # Small models' bare JSON calls are calls here (the app shows and asks about them).
            end = thinking.end if thinking else ""
            self.tool_plan = plan_tools(request, template, end, lenient=True)

    def add_tool_result(self, call: ToolCallMade, text: str, *, kind: str = "result") -> None:
        """The outcome of one of the last reply's calls, as a `tool` message the next reply
        reads (`kind`: result, error, denied, timeout, cancelled, crashed); stored."""
        self.messages.append(
            {"role": "tool", "content": text, "tool_call_id": call.id, "name": call.name}
        )
        if self.history is not None and self.session_id is not None:
            self._stored[len(self.messages) - 1] = self.history.add_message(
                self.session_id, "tool", text, tools=result_json(call.id, call.name, kind)
            )

    def follow_up(self, options: GenerationOptions = NO_OPTIONS) -> Iterator[ChatEvent]:
        """The model's next reply after the tool results: the same turn goes on."""
        if not self.messages or self.messages[-1]["role"] != "tool":
            raise UsageError("there is no tool result to answer: send a message instead")
        last_user = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
        reserve = reply_room(self.n_ctx, options.max_tokens, self.reply_reserve)
        start, tokens, dropped, n_before = self._fit(last_user, reserve)
        if len(tokens) >= self.n_ctx - 1:
            raise ContextOverflow(
                len(tokens),
                self.n_ctx,
                f"the tool results need {len(tokens)} tokens with the chat, but the context "
                f"window holds {self.n_ctx}: start a new chat or raise the context with -c",
            )
        yield from self._answer(last_user, (start, tokens, dropped, n_before), options=options)

    def room_for_result(self) -> int:
        """Tokens a tool result may take: what the window has left after the chat so far and
        the room kept for the reply, shared by the last reply's calls."""
        used = len(self._tokens(self.window_start, self.window()))
        last = self.messages[-1] if self.messages else {}
        calls = max(1, len(last.get("tool_calls") or ()))
        return max(0, (self.n_ctx - self.reply_reserve - used) // calls)

    # --- versions ------------------------------------------------------------------------------

    def _cut(self, index: int) -> Callable[[], None]:
        """Drop messages[index:] from the window (they stay stored); returns an undo."""
        saved = (self.messages[index:], self.window_start, dict(self._pins), dict(self._stored))
        del self.messages[index:]
        self._pins = {i: p for i, p in self._pins.items() if i < index}
        self._stored = {i: m for i, m in self._stored.items() if i < index}
        self.window_start = min(self.window_start, index)

        def undo() -> None:
            self.messages.extend(saved[0])
            self.window_start, self._pins, self._stored = saved[1], saved[2], saved[3]

        return undo

    def _check_index(self, index: int, role: str) -> int:
        if index < 0:
            index += len(self.messages)
        if not 0 <= index < len(self.messages) or self.messages[index]["role"] != role:
            what = "a reply" if role == "assistant" else "a message of yours"
            raise UsageError(f"message {index} of this chat is not {what}: pick {what}")
        return index

    def regenerate(
        self,
        index: int = -1,
        options: GenerationOptions = NO_OPTIONS,
    ) -> Iterator[ChatEvent]:
        """A new version of the reply at `index` (default: the last), streamed.

        Messages after it leave the current path (they stay stored, under the old version).
        """
        index = self._check_index(index, "assistant")
        users = [i for i in range(index) if self.messages[i]["role"] == "user"]
        if not users:
            raise UsageError("this reply answers no message of yours: there is nothing to redo")
        old = self._stored.get(index)
        self._cut(index)
        # A reply whose turn had left the window brings its turn back in.
        self.window_start = min(self.window_start, users[-1])
        reserve = reply_room(self.n_ctx, options.max_tokens, self.reply_reserve)
        fitted = self._fit(users[-1], reserve)
        yield from self._answer(
            users[-1],
            fitted,
            options=options,
            sibling_of=old,
        )

    def edit(
        self,
        index: int,
        text: str,
        options: GenerationOptions = NO_OPTIONS,
    ) -> Iterator[ChatEvent]:
        """Replace the user message at `index` with a new version, `text`, and stream a reply.

        The old message and everything after it stay stored, as the other version.
        """
        index = self._check_index(index, "user")
        old = self._stored.get(index)
        images = stored_images(self.history, old)  # the new version keeps them
        undo = self._cut(index)
        yield from self._turn(text, options=options, sibling_of=old, restore=undo, images=images)

    def stored_ids(self) -> dict[int, int]:
        """Message index -> its row in the history, for the messages that are stored."""
        return dict(self._stored)

    def versions(self, index: int) -> list[StoredMessage]:
        """The stored versions of the message at `index`, oldest first (empty if not stored)."""
        message_id = self._stored.get(index)
        if self.history is None or message_id is None:
            return []
        return self.history.siblings(message_id)

    def switch_version(self, index: int, step: int) -> list[StoredMessage]:
        """Show the version `step` places from the one at `index` (-1: previous, 1: next).

        The path below the chosen version is the one last used there. The window is rebuilt
        from the new path as `resume` does; returns the path (the stored messages).
        """
        if self.history is None or self.session_id is None:
            raise UsageError("this chat is not saved yet, so it has no other versions")
        versions = self.versions(index)
        if not versions:
            raise UsageError(f"message {index} of this chat is not saved: it has no versions")
        current = next(i for i, m in enumerate(versions) if m.id == self._stored[index])
        target = versions[max(0, min(len(versions) - 1, current + step))]
        if target.id != versions[current].id:
            self.history.switch_to(target.id)
        return self._load_path()

    def _load_path(self) -> list[StoredMessage]:
        """Rebuild messages, window and KV cache from the stored current path."""
        assert self.history is not None and self.session_id is not None
        stored = self.history.messages(self.session_id)
        self.messages = [_message(m) for m in stored]
        self._stored = {i: m.id for i, m in enumerate(stored)}
        # Pins hold for the same text only (checked where they are used); drop the rest.
        self._pins = {
            i: pin
            for i, pin in self._pins.items()
            if i < len(self.messages) and self.messages[i]["content"] == pin[0]
        }
        restore_images(stored, self.messages, self._pins, self.engine, self._plain, self.history)
        self.window_start = 0
        users = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        self.expected_cache = []
        if users:
            start, tokens, _, _ = self._fit(users[-1], self.reply_reserve)
            self.window_start = start
            if len(tokens) < self.n_ctx:
                self.engine.evaluate(tokens)
                self.expected_cache = list(tokens)
        return stored

    def _shift(self, start: int, tokens: list[int], dropped: int, n_dropped: int) -> Shifted:
        """Move the window to `start` before a turn; shift the KV cache to match when possible."""
        self.window_start = start
        engine = self.engine
        if engine.can_shift:
            a, b = engine.shift_to(tokens)
            n_tokens = b - a if b > a else n_dropped
            return Shifted(dropped, n_tokens, reprocessed=(b == a), during_reply=False)
        return Shifted(dropped, n_dropped, reprocessed=True, during_reply=False)

    def complete(
        self,
        tokens: list[int],
        options: GenerationOptions = NO_OPTIONS,
    ) -> Iterator[ChatEvent]:
        """Generate after raw prompt tokens (no template), with the same continuation."""
        if len(tokens) >= self.n_ctx:
            raise ContextOverflow(len(tokens), self.n_ctx)
        self.messages.append({"role": "user", "content": ""})
        yield from self._reply(
            tokens,
            options=options,
            shifts=[],
            last_user=len(self.messages) - 1,
            raw=True,
        )

    def continue_reply(
        self,
        options: GenerationOptions = NO_OPTIONS,
    ) -> Iterator[ChatEvent]:
        """Continue the last assistant message (e.g. one that was interrupted) from its text."""
        if not getattr(self.engine, "continues", True):
            raise UsageError(getattr(self.engine, "continue_problem", "this model cannot continue"))
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("there is no reply to continue")
        last_user = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
        last = self.messages[-1]
        prefix, thought = last["content"], last.get("reasoning_content", "")
        window = self.window()
        thinking = None
        if thought and not prefix:
            # Cut while thinking: the prompt ends inside the block, and the thought goes on.
            thinking = self.prompts.thinking_after(self.prompts.encode(""))
            if thinking is not None:
                opened = thinking.start + thinking.start_gap + thought
                window[-1] = {"role": "assistant", "content": opened}
                thinking = replace(thinking, opened_by_prompt=True, prompt_tail="", start_gap="")
        tokens = self._tokens(self.window_start, window, continue_final=True)
        yield from self._reply(
            tokens,
            options=replace(options, thinking=thinking) if thinking else options,
            shifts=[],
            last_user=last_user,
            prefix_text=prefix,
            prefix_reasoning=thought,
            reply_index=len(self.messages) - 1,
        )

    # --- persistence ---------------------------------------------------------------------------

    @classmethod
    def resume(
        cls,
        history: History,
        session_id: int,
        engine: ChatEngine,
        prompts: PromptBuilder,
        *,
        max_continues: int = 3,
        reply_reserve: int | None = None,
    ) -> ChatSession:
        """Reload a stored session, fit its window and rebuild the KV cache for it."""
        stored = history.session(session_id)
        if stored is None:
            raise ValueError(f"no chat session {session_id}")
        session = cls(
            engine,
            prompts,
            system=stored.system,
            history=history,
            session_id=session_id,
            max_continues=max_continues,
            reply_reserve=reply_reserve,
        )
        session._load_path()
        return session


def _message(m: StoredMessage) -> dict[str, Any]:
    """A stored message as the template takes it (a thought as `reasoning_content`, tool
    calls and results as OpenAI's messages carry them)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    return with_tools(out, m.role, m.tools)
