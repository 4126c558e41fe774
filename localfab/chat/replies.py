"""Streaming one reply of a chat: pieces, continuations, a shift when the window fills.

`ReplyStreaming` is the part of `ChatSession` that runs a reply once its prompt is fitted: it
streams the engine's tokens, continues a reply cut at the token limit as a prefilled assistant
turn (token for token, so the pieces join without repeats), makes room when the window fills
mid-reply by dropping whole oldest turns, and writes the reply to the history as it grows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from localfab.chat.events import FINISH_STATUS, ChatEvent, Continued, Reply, Shifted
from localfab.chat.fitting import fit_turns
from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.tools import ToolPlan
from localfab.chat.toolturns import ToolCallMade, calls_json, calls_made
from localfab.engine import ChatEngine, Done
from localfab.engine.reasoning import Thinking
from localfab.engine.types import GenerationOptions

# How often a growing reply is written to disk: bounded write cost, bounded loss on a crash.
FLUSH_SECONDS = 0.25


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
    reasoning: list[str] = field(default_factory=list)  # a thinking model's thought so far
    calls: tuple[ToolCallMade, ...] = ()  # the tool calls it made


class ReplyStreaming:
    """The window's prompt and the streaming of one reply, for `ChatSession`."""

    engine: ChatEngine
    prompts: PromptBuilder
    system: str | None
    max_continues: int
    n_ctx: int
    messages: list[dict[str, Any]]
    window_start: int
    history: History | None
    session_id: int | None
    expected_cache: list[int]
    _pins: dict[int, tuple[str, tuple[int, ...]]]
    _stored: dict[int, int]
    # With tools: how replies call them (parser, grammar), and the system prompt with the
    # tools described where the template does not show them (None: `system` as it is).
    tool_plan: ToolPlan | None
    tool_system: str | None

    def window(self, start: int | None = None) -> list[dict[str, Any]]:
        """System prompt + messages from `start` (default: the window's start)."""
        system = self.system if self.tool_system is None else self.tool_system
        head = [{"role": "system", "content": system}] if system else []
        return head + self.messages[self.window_start if start is None else start :]

    def _tokens(
        self, start: int, messages: list[dict[str, Any]], *, continue_final: bool = False
    ) -> list[int]:
        """Prompt tokens of `messages`, a window that begins at message `start`."""
        system = self.system if self.tool_system is None else self.tool_system
        offset = (1 if system else 0) - start
        pinned = {
            index + offset: tokens
            for index, (content, tokens) in self._pins.items()
            if index >= start  # messages before the window are not in it
            and index + offset < len(messages)
            and self.messages[index]["content"] == content
        }
        return self.prompts.tokens(messages, continue_final=continue_final, pinned=pinned)

    def _reply(
        self,
        prompt: list[int],
        *,
        options: GenerationOptions,
        shifts: list[Shifted],
        last_user: int,
        prefix_text: str = "",
        prefix_reasoning: str = "",
        reply_index: int | None = None,
        sibling_of: int | None = None,
        raw: bool = False,
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
        if prefix_reasoning:
            run.reasoning.append(prefix_reasoning)
        run.reply_id = self._reply_row(reply_index, prefix_text, sibling_of)
        on_full = self._on_full(run, last_user, prefix_text)
        status = "interrupted"
        thinking = options.thinking if raw else self._thinking(prompt, options)
        if self.tool_plan is not None and not raw:
            options = self.tool_plan.onto(options)
        piece = replace(options, on_context_full=on_full, thinking=thinking)
        try:
            while True:
                done = yield from self._piece(run, piece)
                if not self._goes_on(run, done, options.cancel):
                    break
                run.continues += 1
                yield Continued(run.continues, self.max_continues)
                # The reply so far, token for token, is the prefilled assistant turn.
                run.reply_tokens.extend(done.tokens)
                piece = replace(piece, carry=done.pending, **_thought_goes_on(piece, done))
            status = FINISH_STATUS.get(run.pieces[-1].finish_reason, "complete")
            yield self._finished(run, prefix_text)
        finally:
            if run.reply_id is not None:
                self.history.update_message(  # type: ignore[union-attr]
                    run.reply_id,
                    "".join(run.parts),
                    status=status,
                    continues=run.continues,
                    reasoning="".join(run.reasoning),
                    tools=calls_json(run.calls),
                )

    def _thinking(self, prompt: list[int], options: GenerationOptions) -> Thinking | None:
        """How the reply to `prompt` thinks: as `options` say, else as the template's tags and
        the prompt's end say (None: the template does not think)."""
        if options.thinking is not None:
            return options.thinking
        return self.prompts.thinking_after(prompt)

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
        self, run: _ReplyRun, options: GenerationOptions
    ) -> Generator[ChatEvent, None, Done]:
        """Stream one piece of the reply (the first, or a continuation); returns its Done."""
        done: Done | None = None
        for event in self.engine.stream(run.base_prompt + run.reply_tokens, options):
            while run.pending_events:
                yield run.pending_events.pop(0)
            if isinstance(event, Done):
                done = event
                break
            if event.parts is not None:
                for kind, text in event.parts:
                    self._grow(run, text, reasoning=kind == "reasoning")
            elif event.text:
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

    def _grow(self, run: _ReplyRun, text: str, *, reasoning: bool = False) -> None:
        """Add text to the reply (or to its thought); write it to the history every
        FLUSH_SECONDS."""
        message = self.messages[run.index]
        if reasoning:
            run.reasoning.append(text)
            message["reasoning_content"] = "".join(run.reasoning)
        else:
            run.parts.append(text)
            message["content"] = "".join(run.parts)
        now = time.monotonic()
        if run.reply_id is not None and now - run.last_flush >= FLUSH_SECONDS:
            self.history.update_message(  # type: ignore[union-attr]
                run.reply_id, "".join(run.parts), reasoning="".join(run.reasoning)
            )
            run.last_flush = now

    def _goes_on(self, run: _ReplyRun, done: Done, cancel: threading.Event | None) -> bool:
        """Whether a piece cut at the token limit is continued."""
        room = self.n_ctx - len(run.base_prompt) - len(run.reply_tokens) - len(done.tokens) - 1
        return (
            done.stop_type == "limit"
            and not done.tool_calls  # a call cut short is not continued as text
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
        if self.tool_plan is not None:
            run.calls = calls_made(last.tool_calls, self.tool_plan.calling.syntax.id_chars)
        if run.calls:
            self.messages[run.index]["tool_calls"] = [c.message_call() for c in run.calls]
        generated = run.reply_tokens + list(last.tokens)
        # Pinned only when the tokens spell exactly the reply's text: not a reply cut at a
        # stop string, nor one with control tokens (whose text the reply does not show).
        if not prefix_text and generated and self.prompts.spelled(generated) == text.encode():
            self._pins[run.index] = (text, tuple(generated))
        return Reply(
            reasoning="".join(run.reasoning),
            reasoning_tokens=sum(p.reasoning_tokens for p in run.pieces),
            text=text,
            finish_reason=last.finish_reason,
            stop_type=last.stop_type,
            continues=run.continues,
            shifts=tuple(run.shifts),
            timings=run.pieces[0].timings,
            pieces=tuple(run.pieces),
            tool_calls=run.calls,
        )


def _thought_goes_on(piece: GenerationOptions, done: Done) -> dict[str, Any]:
    """What a continuation of `piece` asks of the split: a piece that ended inside the block
    goes on inside it (with what is left of the budget), one that ended in the answer is all
    answer."""
    thinking = piece.thinking
    if thinking is None:
        return {}
    if not done.in_reasoning:
        return {"thinking": None}
    budget = piece.reasoning_budget
    return {
        "thinking": replace(thinking, opened_by_prompt=True, prompt_tail="", start_gap=""),
        "reasoning_budget": max(0, budget - done.reasoning_tokens) if budget >= 0 else budget,
    }
