"""A chat session's events as the app's events (`ReplyEvent`), with the figures the status bar
and the reply's footer show: speed, energy, the prompt cache's notes, and a thinking model's
thought (its text apart from the answer's, its tokens, how long it took)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from localfab.tui.backend import (
    ReplyContinued,
    ReplyEvent,
    ReplyFinished,
    ReplyText,
    ToolCallShown,
    ToolCallWriting,
    WindowShifted,
)
from localfab.tui.cache_notes import drain, prompt_note

if TYPE_CHECKING:
    from localfab.chat.events import Reply
    from localfab.machine.energy import Energy


class ThoughtClock:
    """When a reply's thought began and when its answer did (monotonic seconds)."""

    def __init__(self) -> None:
        self.thought_at: float | None = None
        self.answer_at: float | None = None

    def saw(self, kind: str) -> None:
        now = time.monotonic()
        if kind == "reasoning":
            if self.thought_at is None:
                self.thought_at = now
        elif self.answer_at is None:
            self.answer_at = now

    def thought_ms(self) -> float | None:
        """From the thought's first token to the answer's (or to now, with no answer)."""
        if self.thought_at is None:
            return None
        end = self.answer_at if self.answer_at is not None else time.monotonic()
        return max(0.0, end - self.thought_at) * 1e3


def translate(
    events: Iterator[Any],
    *,
    energy: Callable[[], Energy | None] = lambda: None,
    opened: str = "",
    notes: list[str] | None = None,
) -> Iterator[ReplyEvent]:
    """ChatSession's events as the app's events, with the live figures the status bar shows.

    `energy` gives the reply's measured energy once the reply has ended (None: not measured);
    `opened` is what opening the chat did with its window (see `window_note`); `notes` are
    emptied into the reply's end.
    """
    from localfab.chat.session import Continued, Reply, Shifted

    clock = ThoughtClock()
    calls = 0
    for event in events:
        for delta in getattr(event, "calls", ()):
            if delta.name:  # a call's name: the model has begun one
                calls += 1
                yield ToolCallWriting(delta.name, calls)
        if isinstance(event, Reply):
            yield finished(event, energy(), prompt_note(event.timings, opened), drain(notes), clock)
        elif isinstance(event, Shifted):
            yield WindowShifted(event.turns, event.tokens, event.reprocessed)
        elif isinstance(event, Continued):
            yield ReplyContinued(event.count, event.limit)
        elif event.parts is not None:
            tokens = 1  # the token counts once, however its text splits
            for kind, text in event.parts:
                clock.saw(kind)
                yield ReplyText(text, tokens, thought=kind == "reasoning")
                tokens = 0
        elif event.text:
            yield ReplyText(event.text)


def finished(
    reply: Reply,
    measured: Energy | None,
    note: str,
    notes: tuple[str, ...],
    clock: ThoughtClock,
) -> ReplyFinished:
    """The reply's end, with its figures."""
    steps = sum(max(0, p.timings.predicted_n - 1) for p in reply.pieces)
    decode_ms = sum(p.timings.predicted_ms for p in reply.pieces)
    per_token = None
    if measured is not None and measured.joules is not None and reply.completion_tokens:
        per_token = measured.joules / reply.completion_tokens
    return ReplyFinished(
        text=reply.text,
        finish_reason=reply.finish_reason,
        completion_tokens=reply.completion_tokens,
        ttft_ms=reply.timings.ttft_ms,
        tokens_per_second=steps / decode_ms * 1e3 if decode_ms > 0 else 0.0,
        continues=reply.continues,
        joules_per_token=per_token,
        draft_acceptance=reply.timings.draft_acceptance if reply.timings.draft_n else None,
        prompt_note=note,
        notes=notes,
        reasoning=reply.reasoning,
        thought_tokens=reply.reasoning_tokens,
        thought_ms=clock.thought_ms() if reply.reasoning else None,
        tool_calls=tuple(ToolCallShown(c.id, c.name, c.arguments) for c in reply.tool_calls),
    )
