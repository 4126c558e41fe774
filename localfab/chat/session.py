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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localfab.chat.history import History, StoredMessage
from localfab.chat.prompt import PromptBuilder
from localfab.engine import ChatEngine, Done, SamplingParams, Timings, TokenEvent
from localfab.errors import ContextOverflow, UsageError

# Default room kept free for the reply when fitting the window: a quarter of the context
# (llama-server's n_keep/n_discard halves the window on overflow; a quarter keeps more history
# while leaving a reply of useful length before a shift during generation is needed).
REPLY_RESERVE_FRACTION = 4


def reply_room(n_ctx: int, max_tokens: int, reserve: int | None = None) -> int:
    """Tokens kept free for the reply when a chat is fitted into the window: `reserve` (else a
    quarter of the context), or the reply's `max_tokens` when that is less. The chat session and
    the server's chat endpoint both fit with this rule."""
    base = n_ctx // REPLY_RESERVE_FRACTION if reserve is None else reserve
    return min(base, max_tokens) if max_tokens > 0 else base


# How often a growing reply is written to disk: bounded write cost, bounded loss on a crash.
FLUSH_SECONDS = 0.25


@dataclass(frozen=True)
class Shifted:
    """Whole oldest turns left the window."""

    turns: int
    tokens: int
    reprocessed: bool  # True when the model's cache cannot shift and the rest was re-processed
    during_reply: bool

    def describe(self) -> str:
        how = "re-processed the rest" if self.reprocessed else "kept the rest without re-processing"
        return (
            f"context full: {self.turns} oldest turn(s) ({self.tokens} tokens) left the window; "
            f"{how}"
        )


@dataclass(frozen=True)
class Continued:
    """The reply hit the token limit and is being continued (count: this continuation's number)."""

    count: int
    limit: int


@dataclass(frozen=True)
class Reply:
    """The finished reply of one turn."""

    text: str
    finish_reason: str
    stop_type: str
    continues: int
    shifts: tuple[Shifted, ...]
    timings: Timings  # of the first piece: its TTFT is the turn's TTFT
    pieces: tuple[Done, ...] = field(default_factory=tuple)

    @property
    def completion_tokens(self) -> int:
        """Sampled tokens over all pieces, counted as llama-server counts them."""
        return sum(p.completion_tokens for p in self.pieces)


ChatEvent = TokenEvent | Shifted | Continued | Reply

# A reply's stored status by how its last piece finished.
FINISH_STATUS = {"cancelled": "interrupted", "length": "length"}


@dataclass
class _ReplyRun:
    """What one reply keeps while it streams, over its pieces (continuations)."""

    index: int  # the reply's place in ChatSession.messages
    parts: list[str]  # its text so far, in pieces
    base_prompt: list[int]  # the window up to where the reply starts
    shifts: list[Shifted]
    last_flush: float
    reply_id: int | None = None  # its row in the history
    reply_tokens: list[int] = field(default_factory=list)  # tokens of its earlier pieces
    pieces: list[Done] = field(default_factory=list)
    pending_events: list[Shifted] = field(default_factory=list)
    continues: int = 0


def next_turn_start(messages: Sequence[Mapping[str, Any]], start: int, last: int) -> int | None:
    """Index of the user message that starts the turn after `start`, up to `last`."""
    for i in range(start + 1, last + 1):
        if messages[i]["role"] == "user":
            return i
    return None


def fit_turns(
    messages: Sequence[Mapping[str, Any]],
    start: int,
    last_user: int,
    tokens_from: Callable[[int], list[int]],
    budget: int,
) -> tuple[int, list[int], int, int]:
    """Drop whole oldest turns of `messages` until the prompt fits in `budget` tokens.

    `tokens_from(i)` is the prompt of the system prompt plus messages[i:]; turns start at user
    messages and the one at `last_user` always stays. Returns (first kept message, its prompt,
    turns dropped, tokens of the prompt before dropping); the prompt may still exceed the
    budget when only the last turn is left.

    As few turns as possible are dropped. A prompt only grows with the turns it holds, so the
    first turn to keep is searched for from the newest turn backwards, doubling the step and
    then halving it: the prompts built are never much longer than the one that fits, however
    long the conversation is (dropping one turn at a time from the oldest would build the
    whole conversation once per dropped turn). Where a template makes a prompt shorter with
    more turns (one that puts the system prompt into the first user turn, say), the search
    can keep fewer turns than the oldest start that fits; what it keeps always fits.
    """
    tokens = tokens_from(start)
    n_before = len(tokens)
    if len(tokens) <= budget:
        return start, tokens, 0, n_before
    starts = [i for i in range(start + 1, last_user + 1) if messages[i]["role"] == "user"]
    if not starts:
        return start, tokens, 0, n_before
    built: dict[int, list[int]] = {}

    def fits(k: int) -> bool:  # the window that starts at turn starts[k]
        built[k] = tokens_from(starts[k])
        return len(built[k]) <= budget

    fit = len(starts) - 1  # the last turn: kept even when it does not fit
    if fits(fit):
        short = -1  # a turn known not to fit (-1: the window as it was)
        step = 1
        while fit - step > short:
            if not fits(fit - step):
                short = fit - step
                break
            fit -= step
            step *= 2
        while fit - short > 1:
            mid = (short + fit) // 2
            if fits(mid):
                fit = mid
            else:
                short = mid
    return starts[fit], built[fit], fit + 1, n_before


class ChatSession:
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
        self.max_continues = max_continues
        self.n_ctx: int = engine.n_ctx
        self.reply_reserve = (
            reply_reserve if reply_reserve is not None else self.n_ctx // REPLY_RESERVE_FRACTION
        )
        self.messages: list[dict[str, str]] = []
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

    # --- the window ----------------------------------------------------------------------------

    def window(self, start: int | None = None) -> list[dict[str, str]]:
        """System prompt + messages from `start` (default: the window's start)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages[self.window_start if start is None else start :]

    def _tokens(
        self, start: int, messages: list[dict[str, str]], *, continue_final: bool = False
    ) -> list[int]:
        """Prompt tokens of `messages`, a window that begins at message `start`."""
        offset = (1 if self.system else 0) - start
        pinned = {
            index + offset: tokens
            for index, (content, tokens) in self._pins.items()
            if index >= start  # messages before the window are not in it
            and index + offset < len(messages)
            and self.messages[index]["content"] == content
        }
        return self.prompts.tokens(messages, continue_final=continue_final, pinned=pinned)

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
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Add a user message and stream the reply (TokenEvents, Shifted, Continued, Reply)."""
        return self._turn(text, max_tokens=max_tokens, sampling=sampling, stop=stop, cancel=cancel)

    def _turn(
        self,
        text: str,
        *,
        max_tokens: int,
        sampling: SamplingParams | None,
        stop: Sequence[str],
        cancel: threading.Event | None,
        sibling_of: int | None = None,
        restore: Callable[[], None] | None = None,
    ) -> Iterator[ChatEvent]:
        """A user message (a new version of stored message `sibling_of`, if given) and its reply.

        `restore` puts the conversation back as it was when the message does not fit.
        """
        self.messages.append({"role": "user", "content": text})
        last_user = len(self.messages) - 1
        reserve = reply_room(self.n_ctx, max_tokens, self.reply_reserve)
        start, tokens, dropped, n_before = self._fit(last_user, reserve)
        if len(tokens) >= self.n_ctx - 1:
            self.messages.pop()
            if restore is not None:
                restore()
            raise ContextOverflow(
                len(tokens),
                self.n_ctx,
                f"this message needs {len(tokens)} tokens with the system prompt, but the "
                f"context window holds {self.n_ctx}: shorten it or raise the context with -c",
            )
        if self.history is not None and self.session_id is not None:
            self._stored[last_user] = self.history.add_message(
                self.session_id, "user", text, sibling_of=sibling_of
            )
        yield from self._answer(
            last_user,
            (start, tokens, dropped, n_before),
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
        )

    def _answer(
        self,
        last_user: int,
        fitted: tuple[int, list[int], int, int],
        *,
        max_tokens: int,
        sampling: SamplingParams | None,
        stop: Sequence[str],
        cancel: threading.Event | None,
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
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            shifts=shifts,
            last_user=last_user,
            sibling_of=sibling_of,
        )

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
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
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
        reserve = reply_room(self.n_ctx, max_tokens, self.reply_reserve)
        fitted = self._fit(users[-1], reserve)
        yield from self._answer(
            users[-1],
            fitted,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            sibling_of=old,
        )

    def edit(
        self,
        index: int,
        text: str,
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Replace the user message at `index` with a new version, `text`, and stream a reply.

        The old message and everything after it stay stored, as the other version.
        """
        index = self._check_index(index, "user")
        old = self._stored.get(index)
        undo = self._cut(index)
        yield from self._turn(
            text,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            sibling_of=old,
            restore=undo,
        )

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
        self.messages = [{"role": m.role, "content": m.content} for m in stored]
        self._stored = {i: m.id for i, m in enumerate(stored)}
        # Pins hold for the same text only (checked where they are used); drop the rest.
        self._pins = {
            i: pin
            for i, pin in self._pins.items()
            if i < len(self.messages) and self.messages[i]["content"] == pin[0]
        }
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

    def _reply(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        sampling: SamplingParams | None,
        stop: Sequence[str],
        cancel: threading.Event | None,
        shifts: list[Shifted],
        last_user: int,
        prefix_text: str = "",
        reply_index: int | None = None,
        sibling_of: int | None = None,
    ) -> Iterator[ChatEvent]:
        if reply_index is None:
            self.messages.append({"role": "assistant", "content": prefix_text})
            reply_index = len(self.messages) - 1
        run = _ReplyRun(
            index=reply_index,
            parts=[prefix_text] if prefix_text else [],
            base_prompt=list(prompt),
            shifts=shifts,
            last_flush=time.monotonic(),
        )
        run.reply_id = self._reply_row(reply_index, prefix_text, sibling_of)
        on_full = self._on_full(run, last_user, prefix_text)
        status = "interrupted"
        try:
            carry = b""
            while True:
                done = yield from self._piece(
                    run,
                    max_tokens=max_tokens,
                    sampling=sampling,
                    stop=stop,
                    cancel=cancel,
                    on_full=on_full,
                    carry=carry,
                )
                if not self._goes_on(run, done, cancel):
                    break
                run.continues += 1
                yield Continued(run.continues, self.max_continues)
                # The reply so far, token for token, is the prefilled assistant turn.
                run.reply_tokens.extend(done.tokens)
                carry = done.pending
            status = FINISH_STATUS.get(run.pieces[-1].finish_reason, "complete")
            yield self._finished(run, prefix_text)
        finally:
            if run.reply_id is not None:
                self.history.update_message(  # type: ignore[union-attr]
                    run.reply_id, "".join(run.parts), status=status, continues=run.continues
                )

    def _reply_row(self, reply_index: int, prefix_text: str, sibling_of: int | None) -> int | None:
        """The reply's row in the history: a continued reply's own, or a new one."""
        if self.history is None or self.session_id is None:
            return None
        reply_id = self._stored.get(reply_index)
        if reply_id is None:
            reply_id = self.history.add_message(
                self.session_id,
                "assistant",
                prefix_text,
                status="generating",
                sibling_of=sibling_of,
            )
            self._stored[reply_index] = reply_id
        return reply_id

    def _on_full(
        self, run: _ReplyRun, last_user: int, prefix_text: str
    ) -> Callable[[list[int]], list[int] | None]:
        """What the engine asks when the window fills mid-reply: the shorter window, or None."""
        engine = self.engine

        def on_full(generated: list[int]) -> list[int] | None:
            tail = run.reply_tokens + generated[:-1]

            def prompt_from(start: int) -> list[int]:
                if start == self.window_start:
                    return run.base_prompt
                window = self.window(start)
                if prefix_text:
                    window[-1] = {"role": "assistant", "content": prefix_text}
                    return self._tokens(start, window, continue_final=True)
                return self._tokens(start, window[:-1])

            # As few oldest turns leave as it takes for the reply to go on.
            start, tokens, dropped, before = fit_turns(
                self.messages, self.window_start, last_user, prompt_from, self.n_ctx - 1 - len(tail)
            )
            if not dropped or len(tokens) + len(tail) >= self.n_ctx:
                return None
            self.window_start, run.base_prompt = start, tokens
            event = Shifted(dropped, before - len(tokens), not engine.can_shift, True)
            run.pending_events.append(event)
            run.shifts.append(event)
            return tokens + tail

        return on_full

    def _piece(
        self,
        run: _ReplyRun,
        *,
        max_tokens: int,
        sampling: SamplingParams | None,
        stop: Sequence[str],
        cancel: threading.Event | None,
        on_full: Callable[[list[int]], list[int] | None],
        carry: bytes,
    ) -> Generator[ChatEvent, None, Done]:
        """Stream one piece of the reply (the first, or a continuation); returns its Done."""
        done: Done | None = None
        for event in self.engine.stream(
            run.base_prompt + run.reply_tokens,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            on_context_full=on_full,
            carry=carry,
        ):
            while run.pending_events:
                yield run.pending_events.pop(0)
            if isinstance(event, Done):
                done = event
                break
            if event.text:
                self._grow(run, event.text)
            yield event
        while run.pending_events:
            yield run.pending_events.pop(0)
        assert done is not None
        run.pieces.append(done)
        in_cache = list(done.tokens) if done.stop_type == "eos" else list(done.tokens[:-1])
        # on_full may have moved the window while the piece streamed.
        self.expected_cache = run.base_prompt + run.reply_tokens + in_cache
        return done

    def _grow(self, run: _ReplyRun, text: str) -> None:
        """Add text to the reply; write it to the history every FLUSH_SECONDS."""
        run.parts.append(text)
        self.messages[run.index]["content"] = "".join(run.parts)
        now = time.monotonic()
        if run.reply_id is not None and now - run.last_flush >= FLUSH_SECONDS:
            self.history.update_message(run.reply_id, "".join(run.parts))  # type: ignore[union-attr]
            run.last_flush = now

    def _goes_on(self, run: _ReplyRun, done: Done, cancel: threading.Event | None) -> bool:
        """Whether a piece cut at the token limit is continued."""
        room = self.n_ctx - len(run.base_prompt) - len(run.reply_tokens) - len(done.tokens) - 1
        return (
            done.stop_type == "limit"
            and run.continues < self.max_continues
            and room > 0
            and not (cancel is not None and cancel.is_set())
        )

    def _finished(self, run: _ReplyRun, prefix_text: str) -> Reply:
        last = run.pieces[-1]
        if last.pending:
            run.parts.append(last.pending.decode("utf-8", errors="replace"))
        text = "".join(run.parts)
        self.messages[run.index]["content"] = text
        generated = run.reply_tokens + list(last.tokens)
        # Pinned only when the tokens spell exactly the reply's text: not a reply cut at a
        # stop string, nor one with control tokens (whose text the reply does not show).
        if not prefix_text and generated and self.prompts.spelled(generated) == text.encode():
            self._pins[run.index] = (text, tuple(generated))
        return Reply(
            text=text,
            finish_reason=last.finish_reason,
            stop_type=last.stop_type,
            continues=run.continues,
            shifts=tuple(run.shifts),
            timings=run.pieces[0].timings,
            pieces=tuple(run.pieces),
        )

    def complete(
        self,
        tokens: list[int],
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Generate after raw prompt tokens (no template), with the same continuation."""
        if len(tokens) >= self.n_ctx:
            raise ContextOverflow(len(tokens), self.n_ctx)
        self.messages.append({"role": "user", "content": ""})
        yield from self._reply(
            tokens,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            shifts=[],
            last_user=len(self.messages) - 1,
        )

    def continue_reply(
        self,
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        """Continue the last assistant message (e.g. one that was interrupted) from its text."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("there is no reply to continue")
        last_user = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
        prefix = self.messages[-1]["content"]
        tokens = self._tokens(self.window_start, self.window(), continue_final=True)
        yield from self._reply(
            tokens,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            cancel=cancel,
            shifts=[],
            last_user=last_user,
            prefix_text=prefix,
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
