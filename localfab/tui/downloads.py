"""The app's download queue: one pull at a time, the rest queued, each cancellable.

The queue outlives the models screen (the user can go back to a chat while a model downloads),
so it is plain Python on its own thread rather than a worker of one screen; screens subscribe to
its changes and turn them into messages. A cancelled or failed pull keeps its partial file in the
store, so pulling the same model again (now, or after a restart) resumes where it stopped.
Nothing here imports textual.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from localfab.errors import LocalfabError, UsageError
from localfab.units import format_bytes, format_duration

if TYPE_CHECKING:
    from localfab.hub.progress import DownloadProgress

State = Literal["queued", "running", "done", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"done", "failed", "cancelled"})
log = logging.getLogger("localfab.tui")


class PullCancelled(LocalfabError):
    """The user cancelled a download; what was downloaded is kept for the next pull."""


# What the queue runs for a job: pull `name`, report progress, stop when the event is set
# (raising `PullCancelled`); returns a line that says what was registered.
PullFunc = Callable[[str, Callable[["DownloadProgress"], None], threading.Event], str]
Listener = Callable[["PullJob"], None]


@dataclass(frozen=True)
class PullJob:
    """A snapshot of one download: what, where it stands, and how it ended."""

    id: int
    name: str
    state: State = "queued"
    progress: DownloadProgress | None = None
    message: str = ""  # the result ("pulled ...") or the error, with what to do

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


@dataclass
class _Slot:
    job: PullJob
    cancel: threading.Event = field(default_factory=threading.Event)


class PullQueue:
    """Runs pulls one at a time on a background thread; the others wait as "queued"."""

    def __init__(self, pull: PullFunc) -> None:
        self._pull = pull
        self._lock = threading.Lock()
        # Listeners hear a job's changes in order: each call reads the job's state as it is then,
        # one call at a time (re-entrant: a listener may cancel a pull).
        self._notify_lock = threading.RLock()
        self._slots: list[_Slot] = []
        self._ids = itertools.count(1)
        self._listeners: list[Listener] = []
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    # queries ------------------------------------------------------------------------------------
    def jobs(self) -> list[PullJob]:
        """Every job of this run of the app, oldest first."""
        with self._lock:
            return [s.job for s in self._slots]

    def active(self, name: str) -> PullJob | None:
        """The queued or running job for `name`, if any."""
        with self._lock:
            slot = self._active_slot(name)
            return None if slot is None else slot.job

    def _active_slot(self, name: str) -> _Slot | None:
        for slot in self._slots:
            if slot.job.name == name and not slot.job.finished:
                return slot
        return None

    # changes ------------------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(job)` on every change (from any thread); returns the unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def add(self, name: str) -> PullJob:
        """Queue a pull of `name`; it starts at once when nothing else is downloading."""
        with self._lock:
            if self._active_slot(name) is not None:
                raise UsageError(f"{name} is already downloading or queued")
            slot = _Slot(PullJob(next(self._ids), name))
            self._slots.append(slot)
            self._idle.clear()
        self._notify(slot)  # "queued" is heard before the worker can say "running"
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="localfab-pulls", daemon=True
                )
                self._thread.start()
        return slot.job

    def cancel(self, name: str) -> bool:
        """Cancel the queued or running pull of `name`; False if there is none.

        A queued pull is dropped at once; a running one stops at its next progress report and
        keeps the bytes it has, so a later pull resumes.
        """
        with self._lock:
            slot = self._active_slot(name)
            if slot is None:
                return False
            slot.cancel.set()
            if slot.job.state != "queued":
                return True
            slot.job = replace(slot.job, state="cancelled", message="cancelled before it started")
        self._notify(slot)
        return True

    def clear_finished(self) -> None:
        """Forget the jobs that ended (the list shows only what is still going on)."""
        with self._lock:
            self._slots = [s for s in self._slots if not s.job.finished]

    def cancel_all(self) -> None:
        for job in self.jobs():
            if not job.finished:
                self.cancel(job.name)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no pull is queued or running (for shutdown and tests)."""
        return self._idle.wait(timeout)

    # the worker ---------------------------------------------------------------------------------
    def _next(self) -> _Slot | None:
        with self._lock:
            for slot in self._slots:
                if slot.job.state == "queued":
                    slot.job = replace(slot.job, state="running")
                    return slot
            self._idle.set()
            self._thread = None
            return None

    def _run(self) -> None:
        while (slot := self._next()) is not None:
            self._notify(slot)
            self._finish(slot, *self._run_one(slot))

    def _run_one(self, slot: _Slot) -> tuple[State, str]:
        def progress(p: DownloadProgress) -> None:
            if slot.cancel.is_set():
                raise PullCancelled(f"the download of {slot.job.name} was cancelled")
            with self._lock:
                slot.job = replace(slot.job, progress=p)
            self._notify(slot)

        try:
            return "done", self._pull(slot.job.name, progress, slot.cancel)
        except PullCancelled:
            kept = slot.job.progress.done if slot.job.progress else 0
            keep = (
                f": {format_bytes(kept, precise=True)} kept, pull again to resume" if kept else ""
            )
            return "cancelled", f"cancelled{keep}"
        except LocalfabError as exc:
            return "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed download must not take the app down
            return "failed", f"download of {slot.job.name} failed ({type(exc).__name__}: {exc})"

    def _finish(self, slot: _Slot, state: State, message: str) -> None:
        with self._lock:
            slot.job = replace(slot.job, state=state, message=message)
        self._notify(slot)

    def _notify(self, slot: _Slot) -> None:
        with self._notify_lock:
            with self._lock:
                listeners = list(self._listeners)
                job = slot.job
            for listener in listeners:
                try:
                    listener(job)
                except Exception:  # a broken listener must not fail the download
                    log.exception("download listener failed")


def describe(job: PullJob) -> str:
    """One line for a job: bytes, speed and time left while it runs; the outcome after."""
    if job.state == "queued":
        return "queued"
    if job.finished:
        return job.message
    p = job.progress
    if p is None:
        return "starting…"
    part = f"part {p.file_index + 1}/{p.file_count} · " if p.file_count > 1 else ""
    total = format_bytes(p.total, precise=True) if p.total is not None else "?"
    amount = f"{format_bytes(p.done, precise=True)} / {total}"
    if p.stage == "wait":
        return f"{part}another localfab is downloading this file: waiting for it"
    if p.stage == "verify":
        return f"{part}checking sha256 · {amount}"
    speed = f"{format_bytes(p.speed, precise=True)}/s" if p.speed > 0 else "-- /s"
    resumed = f" · resumed at {format_bytes(p.resumed, precise=True)}" if p.resumed else ""
    return f"{part}{amount} · {speed} · {format_duration(p.eta)} left{resumed}"
