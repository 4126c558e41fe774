"""The one thread that owns the engine: loads the model, then runs queued jobs.

The engine is not thread-safe, so every generation (and every call that touches the engine's
shared buffers) goes through this thread's FIFO queue. The thread runs the jobs on the engine's
slots (`slots.SlotRunner`), one slot or `-np` of them, decoding every running reply in one batch
per step; calls queued for the engine (tokenize, detokenize) run between steps. The asyncio side
submits a `jobs.Job` and awaits what it emits; a job's `cancel` Event stops its generation at
the next step (a client that went away frees its slot at once).

Should anything escape the thread's loop, the engine is stopped for good, and said so: the
traceback is logged once, every job and call waiting for the thread gets a 503 saying why, every
later one gets it at once, and /health answers it (`failure`), so no request waits forever on a
thread that is gone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.engine.disk_cache import DiskCache
from localfab.engine.prompt_cache import PromptCache
from localfab.engine.types import ContextFull, Done
from localfab.ledger.writer import LedgerWriter, TokenClock, record_generation
from localfab.machine.energy import Energy, EnergyMeter, Measurement
from localfab.server.errors import ApiError
from localfab.server.jobs import Job, SlotView
from localfab.server.metrics import Metrics
from localfab.server.reply_shift import ReplyShift
from localfab.server.slots import STOP, SlotRunner

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel

log = logging.getLogger("localfab.server")


def give_back_memory() -> None:
    """Return the C heap's freed memory to the system (glibc keeps large freed blocks for
    reuse: a sleeping server's RSS would hardly fall); a no-op elsewhere."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class EngineWorker:
    """Owns the LoadedModel; `ready` is set once it is loaded (or `load_error` once it failed)."""

    def __init__(
        self,
        source: LoadedModel | Callable[[], LoadedModel],
        *,
        context_shift: bool = False,
        ledger: LedgerWriter | None = None,
        n_parallel: int = 1,
        cache_ram: int | None = 0,
        cache_idle_slots: bool = False,
        cache_disk: tuple[Path, int] | None = None,
        sleep_idle: float = -1,
    ) -> None:
        self._source = source
        # --sleep-idle-seconds: after this long with nothing to do (no job, no request being
        # handled) the model leaves memory, and comes back with the next work (-1: never).
        # Only a model this worker loads itself can sleep.
        self.sleep_idle = sleep_idle if callable(source) else -1
        self.sleeping = False
        self.in_flight = 0  # requests being handled (the Gate counts them): no sleep meanwhile
        self.last_activity = time.monotonic()  # a request's start or end (the idle clock)
        # Held while deciding to sleep, and by the Gate while it counts a request in and reads
        # `sleeping`: a request either keeps the model awake or sees that it must wake it.
        self.sleep_lock = threading.Lock()
        self._going_to_sleep = False
        self._held: Any = None  # the item that woke the worker, run first
        # Idle conversations' prompts, kept when a slot takes another and restored when they
        # come back (`--cache-ram` bytes; 0: off).
        self.prompt_cache = PromptCache(cache_ram)
        self.cache_idle_slots = cache_idle_slots  # idle slots' prompts kept as a job starts
        self._cache_disk = cache_disk  # the disk tier's (folder, bytes), keyed once loaded
        self.context_shift = context_shift
        # Each reply's figures go to the usage ledger (`localfab stats`), with the energy it
        # took where the machine reports power; None: nothing is measured or recorded.
        self.ledger = ledger
        self._meter: EnergyMeter | None = None
        self.model: LoadedModel | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.metrics = Metrics()
        # What /slots shows, one view per slot; with one slot, [0] is the job running (or last).
        self.n_parallel = max(n_parallel, 1)
        self.slots = [SlotView() for _ in range(self.n_parallel)]
        self.runner: SlotRunner | None = None  # once the model is loaded
        self.on_ready: Callable[[], None] | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ids = itertools.count()
        self._pending: set[Job] = set()
        self._lock = threading.Lock()
        self._failure: str | None = None  # why the engine thread stopped (see `died`)
        self._thread = threading.Thread(target=self._main, name="localfab-engine", daemon=True)
        self._stopping = False

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout: float = 30.0) -> None:
        """Cancel every job, finish the thread; the caller closes the model if it owns it."""
        self._stopping = True
        self.cancel_all()
        self._queue.put(STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def cancel_all(self) -> None:
        with self._lock:
            for job in self._pending:
                job.cancel.set()

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def queued(self) -> int:
        """Jobs waiting for a slot (llama-server's `requests_deferred`)."""
        runner = self.runner
        return self._queue.qsize() + (len(runner.waiting) if runner is not None else 0)

    @property
    def n_processing(self) -> int:
        """Slots running a job now."""
        return sum(1 for s in self.slots if s.processing)

    # --- submitting --------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise ApiError("the server is shutting down", "unavailable_error")
        # Checked and queued under the lock `died` takes: a job is failed there or never queued.
        with self._lock:
            failure = self.failure
            if failure is not None:
                raise failure
            self._pending.add(job)
            self._queue.put(job)

    def call(self, fn: Callable[[LoadedModel], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn(model)` on the engine thread (for calls that share the engine's buffers)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._stopping:
            future.set_exception(ApiError("the server is shutting down", "unavailable_error"))
            return future
        with self._lock:
            failure = self.failure
            if failure is None:
                self._queue.put((fn, future))
        if failure is not None:
            future.set_exception(failure)
        return future

    # --- the engine stopped ----------------------------------------------------------------

    @property
    def failure(self) -> ApiError | None:
        """The 503 every request gets once the engine thread stopped on an error (a new one
        each time: an exception raised again keeps growing its traceback); None while it runs."""
        why = self._failure
        return None if why is None else ApiError(why, "unavailable_error")

    def died(self, exc: BaseException) -> None:
        """The engine thread stops on `exc`: logged once with its traceback; every job and call
        waiting for the thread gets the error now, and every later one at once (`failure`)."""
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = (
                    f"the engine stopped on an error ({type(exc).__name__}: {exc}); no request "
                    "can be answered until the server is restarted (its log has the details)"
                )
            pending = list(self._pending)
            self._pending.clear()
        if first:
            log.error("the engine thread stopped on an error", exc_info=exc)
        for job in pending:
            self._tell(job)
        while True:  # what is queued: its jobs were pending (told above), its calls are not
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple):
                item[1].set_exception(self.failure)

    def _tell(self, job: Job) -> None:
        failure = self.failure
        assert failure is not None
        # A job whose own callback is what failed may fail again: the others are told anyway.
        try:
            job.emit(failure)
        except Exception:
            log.debug("a job could not be told that the engine stopped", exc_info=True)

    # --- the thread --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as exc:  # reported by the front end, which exits
            self.load_error = exc
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()
            return
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready()
        try:
            while True:
                assert self.model is not None
                # As many slots as asked for and the context has sequences (-np loads one per
                # slot); one slot runs the same way as many.
                n_slots = min(self.model.engine.n_seq_max, self.n_parallel)
                self.runner = SlotRunner(self, self.model.engine, n_slots)
                self.runner.run()
                if not self._going_to_sleep or not self._sleep_until_work():
                    return
        except BaseException as exc:  # the thread ends here: nobody may wait for it
            self.died(exc)

    def _load(self) -> None:
        self.model = self._source() if callable(self._source) else self._source
        if self._cache_disk is not None:
            folder, limit = self._cache_disk
            self.prompt_cache.disk = DiskCache(folder, self.model.engine.state_key(), limit)

    def _sleep_until_work(self) -> bool:
        """Free the model, wait for the next item, load the model again; False to stop."""
        self._going_to_sleep = False
        self.runner = None
        model, self.model = self.model, None
        self.prompt_cache.clear()
        if model is not None:
            model.close()
        give_back_memory()
        self.sleeping = True
        log.info("sleeping: the model left memory after %.0f s idle", self.sleep_idle)
        item = self._queue.get()
        if item is STOP or self._stopping:  # shutting down: nothing is loaded again
            if item is not STOP:
                self.load_error = ApiError("the server is shutting down", "unavailable_error")
                self._fail(item)
            return False
        try:
            self._load()
        except BaseException as exc:  # the model cannot come back: every request says why
            log.error("could not load the model again: %s", exc)
            self.load_error = exc
            self._fail(item)
            while (item := self._queue.get()) is not STOP:
                self._fail(item)
            return False
        self.sleeping = False
        log.info("awake: the model is loaded again")
        self._held = item
        return True

    def _fail(self, item: Any) -> None:
        err = (
            self.load_error
            if isinstance(self.load_error, ApiError)
            else ApiError(f"the model could not be loaded again: {self.load_error}", "server_error")
        )
        if isinstance(item, tuple):
            item[1].set_exception(err)
        elif isinstance(item, Job):
            item.emit(err)
            self.finished(item)

    def take(self, block: bool) -> Any:
        """The next queued item (a Job, a call, or the stop mark); None when empty and not
        `block`. With --sleep-idle-seconds, a blocking wait that finds nothing to do for that
        long returns the stop mark with `_going_to_sleep` set."""
        if self._held is not None:
            item, self._held = self._held, None
            return item
        while True:
            timeout = None
            if block and self.sleep_idle > 0:
                idle = time.monotonic() - self.last_activity
                timeout = max(0.05, self.sleep_idle - idle)
            try:
                return self._queue.get(block, timeout)
            except queue.Empty:
                if not block:
                    return None
                with self.sleep_lock:
                    idle = time.monotonic() - self.last_activity
                    if self.in_flight == 0 and idle >= self.sleep_idle:
                        # Said at once: a request from now on wakes the model (its call
                        # waits in the queue until the model is freed and loaded again).
                        self.sleeping = True
                        self._going_to_sleep = True
                        return STOP

    def run_call(self, item: tuple[Callable[[LoadedModel], Any], Any]) -> None:
        fn, future = item
        assert self.model is not None
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(self.model))
            except BaseException as exc:
                future.set_exception(exc)

    def finished(self, job: Job) -> None:
        """A job is over (answered): it no longer needs cancelling on stop."""
        with self._lock:
            self._pending.discard(job)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def record(self, job: Job, done: Done, clock: TokenClock | None, energy: Energy | None) -> None:
        """The reply's row in the usage ledger (when one is kept)."""
        if self.ledger is None:
            return
        assert self.model is not None
        record_generation(
            self.ledger,
            frontend="serve",
            model=str(self.model.path),
            plan=self.model.engine.settings,
            timings=done.timings,
            prompt_tokens=len(job.tokens),
            generated_tokens=done.completion_tokens,
            clock=clock,
            energy=energy,
            model_path=self.model.path,
        )

    def measurement(self) -> Measurement | None:
        """An energy measurement for the next reply, when replies are recorded."""
        if self.ledger is None:
            return None
        if self._meter is None:
            self._meter = EnergyMeter.for_this_machine()
        return self._meter.measure()

    def shifter(self, job: Job) -> ContextFull | None:
        """How a reply that fills the window goes on (ReplyShift); None: it stops there.

        Only with --context-shift (without it the reply stops there, as llama-server's does).
        Either way the engine moves the kept KV cells instead of re-processing them.
        """
        if not self.context_shift:
            return None
        return ReplyShift(job.tokens, job.n_keep, job.window, job.shifted)
