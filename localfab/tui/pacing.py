"""When streamed text goes to the screen: often enough to read as it comes, rarely enough that
the app neither slows the model down nor makes typing lag.

Each screen update of a streaming reply re-parses the reply's open Markdown block and lays the
screen out again, on the thread that shares the GIL (and, on a small machine, the cores) with
the model's decode loop. So the pacer:

- keeps the UI thread's CPU to a share of one core while a reply streams: after an update that
  cost C seconds of UI CPU, the next waits C / share (never less than `min_interval`, never more
  than `max_interval`);
- holds text back for a moment after a key, so that the key's echo is painted first and cheaply,
  but never longer than `max_interval` since the last update.

Only text waits: a reply's end, a failure or a shift goes to the screen at once. The pacer
holds no Textual state: the chat screen sleeps until `wait` says text may be drawn and then
asks `due`, instead of ticking at a fixed rate (on shared cores each wake-up of the UI thread
preempts one of the model's threads, and the others wait for it).

While a reply streams, the objects that existed when it began (the app, its widgets, earlier
messages) are also kept out of the garbage collector's full passes: such a pass walks every
object the app holds (a few hundred thousand) with the GIL held, a pause of 50-150 ms here that
stalls both the keys and the decode loop. They go back, and one full pass runs, when it ends.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The UI thread's share of one core while a reply streams: small when the engine's threads
# take every core (each frame then preempts one of them, and llama.cpp's other threads wait for
# it at the next barrier), larger when a core is left over for the UI.
SHARED_CORES_SHARE = 0.025
JUST_TYPED = 0.02  # a key this recent is still being echoed
SPARE_CORE_SHARE = 0.5
# The longest wait between two text frames. On shared cores a frame costs 10-20 ms of UI CPU
# (a slower CPU pays more), so the share above asks for 0.4-0.8 s; a bound of 0.5 s held a
# slower CPU's UI at 3.5-4.5 % of a core, and its replies 4-5 % slower than `localfab run`.
SHARED_CORES_MAX_INTERVAL = 1.0
SPARE_CORE_MAX_INTERVAL = 0.5


def cpu_share_for(engine_threads: int, cpus: int | None) -> float:
    """The UI's CPU share for an engine decoding on `engine_threads` (0: unknown) of `cpus`."""
    if engine_threads > 0 and cpus is not None and cpus > engine_threads:
        return SPARE_CORE_SHARE
    return SHARED_CORES_SHARE


def max_interval_for(cpu_share: float) -> float:
    """The longest wait between text frames for a UI held to `cpu_share` of a core."""
    return SHARED_CORES_MAX_INTERVAL if cpu_share <= SHARED_CORES_SHARE else SPARE_CORE_MAX_INTERVAL


@dataclass
class FramePacer:
    """Decides, per tick of the chat screen's frame timer, whether streamed text is drawn now."""

    min_interval: float = 1 / 10
    max_interval: float = 0.5
    cpu_share: float = SHARED_CORES_SHARE  # of one core, for the UI thread while text streams
    typing_hold: float = 0.06  # after a key, text waits this long (bounded by max_interval)
    clock: Callable[[], float] = time.monotonic
    cpu_clock: Callable[[], float] = time.thread_time  # the UI thread's own CPU time
    _next_at: float = 0.0
    _drawn_at: float = 0.0
    _cpu_at: float = 0.0
    _typed_at: float = field(default=-1e9)

    def start(self) -> None:
        """A reply begins: its first text is drawn at once."""
        now = self.clock()
        self._next_at = now
        self._drawn_at = now
        self._cpu_at = self.cpu_clock()

    def typed(self, at: float | None = None) -> None:
        """A key reached the prompt box (at `at` on the pacer's clock; default: now)."""
        self._typed_at = self.clock() if at is None else at

    def due(self) -> bool:
        """Whether waiting text should be drawn at this tick."""
        now = self.clock()
        typed = now - self._typed_at
        if now - self._drawn_at >= self.max_interval:
            # Overdue, but a key pressed this instant is echoed first (a tick later at most).
            return typed >= JUST_TYPED or now - self._drawn_at >= 2 * self.max_interval
        if typed < self.typing_hold:
            return False
        return now >= self._next_at

    def wait(self) -> float:
        """Seconds from now to the first tick at which `due` may say yes (0: now).

        The chat screen sleeps that long instead of ticking at a fixed rate: on shared cores
        every wake-up of the UI thread takes a core from the model's threads for a moment.
        """
        now = self.clock()
        if now - self._drawn_at >= self.max_interval:
            at = min(self._typed_at + JUST_TYPED, self._drawn_at + 2 * self.max_interval)
        else:
            at = min(
                max(self._next_at, self._typed_at + self.typing_hold),
                self._drawn_at + self.max_interval,
            )
        # A hair past the moment, so that `due` (which compares with >=) says yes then.
        return 0.0 if at <= now else at - now + 1e-6

    def drawn(self) -> None:
        """Text was drawn: the next draw waits in proportion to what the UI spent since the last.

        The CPU counted runs from the previous draw to this one, so it includes laying out and
        painting the previous update, the keys handled in between and the timer ticks.
        """
        now, cpu = self.clock(), self.cpu_clock()
        spent = max(0.0, cpu - self._cpu_at)
        wait = min(self.max_interval, max(self.min_interval, spent / self.cpu_share))
        self._next_at = now + wait
        self._drawn_at = now
        self._cpu_at = cpu


class StreamingGC:
    """Keeps the garbage collector's full passes short while a reply streams.

    At the start every object is moved out of the collector's sight (`gc.freeze`), and after
    each full pass during the reply the survivors are too, so that a pass walks only what the
    last seconds made (pauses of 5-25 ms instead of 50-150 ms here). At the end, right after the
    reply's last frame is painted, what the reply made goes: when no pass froze anything
    meanwhile (a short reply), one pass over only the objects made since the start collects it
    before everything comes back (a millisecond or two); otherwise, or after `FULL_EVERY` short
    ones, everything comes back first and one full pass collects it all (30-150 ms), so that
    objects from before a reply that became garbage during it (a removed message) go too.
    """

    FULL_EVERY = 8

    def __init__(self) -> None:
        self.active = False
        self._froze = False  # a full pass during this reply froze its survivors
        self._short_ends = 0

    def _after_pass(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()
            self._froze = True

    def begin(self) -> None:
        if not self.active:
            self.active = True
            gc.freeze()  # O(1): the current objects move to the permanent generation
            # (gc.get_freeze_count() would walk them all: about 10 ms for 100k objects)
            self._froze = False
            gc.callbacks.append(self._after_pass)

    def end(self) -> None:
        """The reply ended: everything is collectable again, and garbage made meanwhile goes."""
        if self.active:
            self.active = False
            if self._after_pass in gc.callbacks:
                gc.callbacks.remove(self._after_pass)
            if not self._froze and self._short_ends < self.FULL_EVERY:
                self._short_ends += 1
                gc.collect()  # the frozen objects sit it out: it walks what the reply made
                gc.unfreeze()
            else:
                self._short_ends = 0
                gc.unfreeze()
                gc.collect()
