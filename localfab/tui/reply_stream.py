"""A reply on its way from the engine to the chat screen.

The backend's engine thread runs the reply's generator and puts each event in an inbox (`pump`):
no worker relays them. It wakes the screen only for what is shown at once (the first event, an
end, a failure, a shift); text waits for the frame pacer (`pacing.FramePacer`), so the screen
draws one batch of text per frame however fast tokens come (`take`). The live figures (time to
first token, tokens per second) are counted as the text is taken. Nothing here imports textual:
the screen owns the timer and the drawing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from localfab.errors import LocalfabError
from localfab.tui.backend import ReplyEvent, ReplyText
from localfab.tui.pacing import FramePacer


@dataclass(frozen=True)
class ReplyFailed:
    """The reply could not be generated; `reason` says why."""

    reason: str


class StreamEnd:
    """The reply's generator is done (ended, failed or stopped)."""


STREAM_END = StreamEnd()
InboxItem = ReplyEvent | ReplyFailed | StreamEnd


@dataclass(frozen=True)
class Thought:
    """A run of a thinking model's thought, as `take` joins it (answer text comes as str)."""

    text: str


# The shortest time between two frames of a streaming reply; the pacer says when waiting text
# is drawn, and the screen sleeps until then.
FRAME_SECONDS = 1 / 10


class ReplyStream:
    """The inbox, pacer and figures of the reply streaming now (one at a time)."""

    def __init__(self) -> None:
        self.pacer = FramePacer(min_interval=FRAME_SECONDS)
        self.inbox: deque[InboxItem] = deque()
        self.sent_at = 0.0
        self.first_at: float | None = None
        self.tokens = 0
        self.ended = False  # the reply's end (its final figures) has been shown
        # Set once the reply's generator is done (`pump` returned): saved, nothing more comes.
        self.finished = threading.Event()
        self.finished.set()

    def begin(self) -> None:
        """A reply was sent: its figures start from now."""
        self.sent_at = time.monotonic()
        self.first_at = None
        self.tokens = 0
        self.ended = False
        self.finished.clear()
        self.pacer.start()

    def pump(self, reply: Callable[[], Iterator[ReplyEvent]], wake: Callable[[], object]) -> None:
        """On the thread that generates: move the events of `reply()` into the inbox, waking
        the screen for what is shown at once; a failure becomes a `ReplyFailed`, and
        `STREAM_END` closes it either way."""
        inbox = self.inbox
        first = True
        try:
            for event in reply():
                inbox.append(event)
                if first or not isinstance(event, ReplyText):
                    first = False
                    wake()
        except LocalfabError as exc:
            inbox.append(ReplyFailed(str(exc)))
        except Exception as exc:  # shown on the reply; the chat goes on
            inbox.append(ReplyFailed(f"{type(exc).__name__}: {exc}"))
        finally:
            inbox.append(STREAM_END)
            self.finished.set()
            wake()

    def wait(self) -> float:
        """Seconds until the pacer lets waiting text be drawn (at least a frame when none waits:
        the generating thread wakes the screen for anything else)."""
        wait = self.pacer.wait()
        if not self.inbox:  # (not iterated: the generating thread appends to it meanwhile)
            wait = max(wait, FRAME_SECONDS)
        return max(wait, 0.001)

    def take(self, last_key_at: float | None) -> list[str | Thought | InboxItem] | None:
        """What to draw now, in order: each run of answer text joined into one string, each
        run of thought into one `Thought`, anything else as it is; None while only text waits
        and the pacer says not yet."""
        inbox = self.inbox
        if not inbox:
            return None
        if last_key_at is not None:
            self.pacer.typed(last_key_at)
        if not self.pacer.due() and all(isinstance(i, ReplyText) for i in list(inbox)):
            return None
        out: list[str | Thought | InboxItem] = []
        batch: list[str] = []
        thought = False  # the batch is thought
        while inbox:
            item = inbox.popleft()
            if isinstance(item, ReplyText):
                if self.first_at is None:
                    self.first_at = time.monotonic()
                if batch and item.thought != thought:
                    out.append(_joined(batch, thought))
                    batch = []
                thought = item.thought
                batch.append(item.text)
                self.tokens += item.tokens
                continue
            if batch:
                out.append(_joined(batch, thought))
                batch = []
            out.append(item)
        if batch:
            out.append(_joined(batch, thought))
        return out

    def live_figures(self) -> tuple[float, float | None] | None:
        """TTFT (ms) and tokens per second so far, until the reply's end shows the final
        ones; None before the first token."""
        if self.first_at is None or self.ended:
            return None
        elapsed = time.monotonic() - self.first_at
        ttft = (self.first_at - self.sent_at) * 1e3
        speed = (self.tokens - 1) / elapsed if elapsed > 0.2 and self.tokens > 1 else None
        return ttft, speed


def _joined(batch: list[str], thought: bool) -> str | Thought:
    text = "".join(batch)
    return Thought(text) if thought else text
