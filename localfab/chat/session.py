"""ChatSession: a conversation that never stalls.

When the next turn would not fit in the context window, whole oldest turns leave it (the system
prompt and the latest user message always stay) and the KV cells of the kept turns are moved,
not re-processed. A reply that reaches the end of the window mid-generation makes room the same
way. A reply cut at the token limit is continued as a prefilled assistant turn, token for token,
so the pieces join without repeats. Every message is written to the history as it grows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.engine import Done, SamplingParams, Timings, TokenEvent
from localfab.errors import ContextOverflow

# Default room kept free for the reply when fitting the window: a quarter of the context
# (llama-server's n_keep/n_discard halves the window on overflow; a quarter keeps more history
# while leaving a reply of useful length before a shift during generation is needed).
REPLY_RESERVE_FRACTION = 4
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
        engine: object,
        prompts: PromptBuilder,
        *,
        system: str | None = None,
        max_continues: int = 3,
        reply_reserve: int | None = None,
        history: History | None = None,
        session_id: int | None = None,
        model_name: str = "",
    ) -> None:
        self.engine = engine  # localfab.engine.Engine (typed loosely to keep tests' fakes easy)
        self.prompts = prompts
        self.system = system
        self.max_continues = max_continues
        self.n_ctx: int = engine.n_ctx  # type: ignore[attr-defined]
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
        self.messages.append({"role": "user", "content": text})
        last_user = len(self.messages) - 1
        reserve = min(self.reply_reserve, max_tokens) if max_tokens > 0 else self.reply_reserve
        start, tokens, dropped, n_before = self._fit(last_user, reserve)
        if len(tokens) >= self.n_ctx - 1:
            self.messages.pop()
            raise ContextOverflow(
                len(tokens),
                self.n_ctx,
                f"this message needs {len(tokens)} tokens with the system prompt, but the "
                f"context window holds {self.n_ctx}: shorten it or raise the context with -c",
            )
        if self.history is not None and self.session_id is not None:
            self._stored[last_user] = self.history.add_message(self.session_id, "user", text)
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
        )

    def _shift(self, start: int, tokens: list[int], dropped: int, n_dropped: int) -> Shifted:
        """Move the window to `start` before a turn; shift the KV cache to match when possible."""
        self.window_start = start
        engine = self.engine
        if engine.can_shift:  # type: ignore[attr-defined]
            a, b = engine.shift_to(tokens)  # type: ignore[attr-defined]
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
    ) -> Iterator[ChatEvent]:
        engine = self.engine
        parts: list[str] = [prefix_text] if prefix_text else []
        pieces: list[Done] = []
        reply_id = None
        if reply_index is None:
            self.messages.append({"role": "assistant", "content": prefix_text})
            reply_index = len(self.messages) - 1
        if self.history is not None and self.session_id is not None:
            # A continued reply goes on in its own row; a new one gets a row of its own.
            reply_id = self._stored.get(reply_index)
            if reply_id is None:
                reply_id = self.history.add_message(
                    self.session_id, "assistant", prefix_text, status="generating"
                )
                self._stored[reply_index] = reply_id
        pending_events: list[Shifted] = []
        base_prompt = list(prompt)  # the window up to where the reply starts
        reply_tokens: list[int] = []  # tokens of the reply's earlier pieces (continuations)

        def on_full(generated: list[int]) -> list[int] | None:
            nonlocal base_prompt
            tail = reply_tokens + generated[:-1]

            def prompt_from(start: int) -> list[int]:
                if start == self.window_start:
                    return base_prompt
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
            self.window_start, base_prompt = start, tokens
            event = Shifted(dropped, before - len(tokens), not engine.can_shift, True)  # type: ignore[attr-defined]
            pending_events.append(event)
            shifts.append(event)
            return tokens + tail

        status = "interrupted"
        last_flush = time.monotonic()
        carry = b""
        continues = 0
        try:
            while True:
                done: Done | None = None
                piece_prompt = base_prompt + reply_tokens
                for event in engine.stream(  # type: ignore[attr-defined]
                    piece_prompt,
                    max_tokens=max_tokens,
                    sampling=sampling,
                    stop=stop,
                    cancel=cancel,
                    on_context_full=on_full,
                    carry=carry,
                ):
                    while pending_events:
                        yield pending_events.pop(0)
                    if isinstance(event, Done):
                        done = event
                        break
                    if event.text:
                        parts.append(event.text)
                        self.messages[reply_index]["content"] = "".join(parts)
                        now = time.monotonic()
                        if reply_id is not None and now - last_flush >= FLUSH_SECONDS:
                            self.history.update_message(reply_id, "".join(parts))  # type: ignore[union-attr]
                            last_flush = now
                    yield event
                while pending_events:
                    yield pending_events.pop(0)
                assert done is not None
                pieces.append(done)
                in_cache = list(done.tokens) if done.stop_type == "eos" else list(done.tokens[:-1])
                piece_prompt = base_prompt + reply_tokens  # on_full may have moved it
                self.expected_cache = piece_prompt + in_cache
                room = self.n_ctx - len(piece_prompt) - len(done.tokens) - 1
                if (
                    done.stop_type == "limit"
                    and continues < self.max_continues
                    and room > 0
                    and not (cancel is not None and cancel.is_set())
                ):
                    continues += 1
                    yield Continued(continues, self.max_continues)
                    # The reply so far, token for token, is the prefilled assistant turn.
                    reply_tokens.extend(done.tokens)
                    carry = done.pending
                    continue
                break
            last = pieces[-1]
            finish = last.finish_reason
            if finish == "cancelled":
                status = "interrupted"
            elif finish == "length":
                status = "length"
            else:
                status = "complete"
            if last.pending:
                parts.append(last.pending.decode("utf-8", errors="replace"))
            text = "".join(parts)
            self.messages[reply_index]["content"] = text
            generated = reply_tokens + list(last.tokens)
            # Pinned only when the tokens spell exactly the reply's text: not a reply cut at a
            # stop string, nor one with control tokens (whose text the reply does not show).
            if not prefix_text and generated and self.prompts.spelled(generated) == text.encode():
                self._pins[reply_index] = (text, tuple(generated))
            yield Reply(
                text=text,
                finish_reason=finish,
                stop_type=last.stop_type,
                continues=continues,
                shifts=tuple(shifts),
                timings=pieces[0].timings,
                pieces=tuple(pieces),
            )
        finally:
            if reply_id is not None:
                self.history.update_message(  # type: ignore[union-attr]
                    reply_id, "".join(parts), status=status, continues=continues
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
        engine: object,
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
        stored_messages = history.messages(session_id)
        session.messages = [{"role": m.role, "content": m.content} for m in stored_messages]
        session._stored = {i: m.id for i, m in enumerate(stored_messages)}
        users = [i for i, m in enumerate(session.messages) if m["role"] == "user"]
        if users:
            start, tokens, _, _ = session._fit(users[-1], session.reply_reserve)
            session.window_start = start
            if len(tokens) < session.n_ctx:
                engine.evaluate(tokens)  # type: ignore[attr-defined]
                session.expected_cache = list(tokens)
        return session
