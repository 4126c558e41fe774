"""The one thread that owns the engine: loads the model, then runs queued jobs in order.

The engine is not thread-safe and decodes one sequence at a time, so every generation (and every
call that touches the engine's shared buffers) goes through this thread's FIFO queue. The asyncio
side submits a job with an `emit` callback and awaits what it emits; a job's `cancel` Event stops
its generation at the next token (a client that went away frees the engine at once).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localfab.engine.types import Done, SamplingParams, Timings, TokenEvent
from localfab.errors import ContextOverflow, LocalfabError, UsageError
from localfab.server.chat_window import ChatWindow
from localfab.server.errors import ApiError

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel

log = logging.getLogger("localfab.server")

Emit = Callable[[TokenEvent | Done | ApiError], None]


@dataclass(frozen=True, eq=False)
class Job:
    """One generation request waiting for (or holding) the engine."""

    id: int
    tokens: Sequence[int]
    n_predict: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    emit: Emit
    cache_prompt: bool = True
    n_keep: int = 0
    n_probs: int = 0
    # A chat's messages fitted by whole turns (ChatWindow): it makes room for a reply that
    # fills the window.
    window: ChatWindow | None = None
    params: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Metrics:
    """Counters behind /metrics, named after llama-server's `llamacpp:` series."""

    t_start: float = field(default_factory=time.time)
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0
    # Since the last scrape (llama-server's "bucket" gauges).
    bucket_prompt_n: int = 0
    bucket_prompt_s: float = 0.0
    bucket_predicted_n: int = 0
    bucket_predicted_s: float = 0.0

    def record(self, done: Done, n_batch: int) -> None:
        t = done.timings
        self.prompt_tokens_total += t.prompt_n
        self.prompt_tokens_cached_total += t.cache_n
        self.prompt_seconds_total += t.prompt_ms / 1e3
        self.tokens_predicted_total += t.predicted_n
        self.tokens_predicted_seconds_total += t.predicted_ms / 1e3
        self.n_decode_total += -(-t.prompt_n // max(n_batch, 1)) + max(t.predicted_n - 1, 0)
        self.n_tokens_max = max(self.n_tokens_max, done.prompt_tokens + t.predicted_n)
        self.bucket_prompt_n += t.prompt_n
        self.bucket_prompt_s += t.prompt_ms / 1e3
        self.bucket_predicted_n += t.predicted_n
        self.bucket_predicted_s += t.predicted_ms / 1e3


@dataclass
class SlotView:
    """What /slots shows about the last (or current) job."""

    id_task: int = -1
    processing: bool = False
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_prompt_tokens_cache: int = 0
    n_decoded: int = 0
    n_predict: int = -1
    has_new_line: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    prompt: Sequence[int] = ()
    generated: str = ""


_STOP = object()


class EngineWorker:
    """Owns the LoadedModel; `ready` is set once it is loaded (or `load_error` once it failed)."""

    def __init__(
        self, source: LoadedModel | Callable[[], LoadedModel], *, context_shift: bool = False
    ) -> None:
        self._source = source
        self.context_shift = context_shift
        self.model: LoadedModel | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.metrics = Metrics()
        self.slot = SlotView()
        self.on_ready: Callable[[], None] | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ids = itertools.count()
        self._pending: set[Job] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="localfab-engine", daemon=True)
        self._stopping = False

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout: float = 30.0) -> None:
        """Cancel every job, finish the thread; the caller closes the model if it owns it."""
        self._stopping = True
        self.cancel_all()
        self._queue.put(_STOP)
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
        """Jobs waiting behind the one being decoded (llama-server's `requests_deferred`)."""
        return self._queue.qsize()

    # --- submitting --------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise ApiError("the server is shutting down", "unavailable_error")
        with self._lock:
            self._pending.add(job)
        self._queue.put(job)

    def call(self, fn: Callable[[LoadedModel], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn(model)` on the engine thread (for calls that share the engine's buffers)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._stopping:
            future.set_exception(ApiError("the server is shutting down", "unavailable_error"))
        else:
            self._queue.put((fn, future))
        return future

    # --- the thread --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self.model = self._source() if callable(self._source) else self._source
        except BaseException as exc:  # reported by the front end, which exits
            self.load_error = exc
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()
            return
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready()
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, tuple):
                fn, future = item
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(self.model))
                    except BaseException as exc:
                        future.set_exception(exc)
                continue
            try:
                self._run(item)
            except BaseException as exc:  # never let one request kill the engine thread
                log.exception("generation failed")
                item.emit(ApiError(f"generation failed: {exc}", "server_error"))
            finally:
                with self._lock:
                    self._pending.discard(item)

    def _run(self, job: Job) -> None:
        assert self.model is not None
        engine = self.model.engine
        if job.cancel.is_set() or self._stopping:
            job.emit(_cancelled(len(job.tokens)))
            return
        slot = SlotView(
            id_task=job.id,
            processing=True,
            n_prompt_tokens=len(job.tokens),
            n_predict=job.n_predict,
            params=job.params,
            prompt=job.tokens,
        )
        self.slot = slot
        if not job.cache_prompt:
            engine.clear_cache()
        done: Done | None = None
        try:
            if not job.tokens:
                # llama-server answers an empty prompt with an empty result.
                done = Done("", "length", "none", (), Timings(), 0)
            elif job.n_predict == 0:
                done = self._evaluate_only(job)
            else:
                if job.window is not None and job.window.left_out["turns"] and engine.can_shift:
                    # Turns were left out: move the kept ones' KV cells rather than process them.
                    engine.shift_to(job.tokens)
                parts: list[str] = []
                for event in engine.stream(
                    job.tokens,
                    max_tokens=job.n_predict,
                    sampling=job.sampling,
                    stop=job.stop,
                    cancel=job.cancel,
                    on_context_full=self._shifter(job),
                    n_probs=job.n_probs,
                ):
                    if isinstance(event, Done):
                        done = event
                        break
                    slot.n_decoded += 1
                    if event.text:
                        parts.append(event.text)
                        if "\n" in event.text:
                            slot.has_new_line = True
                    job.emit(event)
                slot.generated = "".join(parts)
        except ContextOverflow as exc:
            job.emit(ApiError.exceed_context(exc.n_prompt_tokens, exc.n_ctx))
            return
        except UsageError as exc:
            job.emit(ApiError(str(exc)))
            return
        except LocalfabError as exc:
            job.emit(ApiError(str(exc), "server_error"))
            return
        finally:
            slot.processing = False
        if done is None:  # the engine always ends with Done; this guards a broken contract
            job.emit(ApiError("the generation ended without a result", "server_error"))
            return
        slot.n_prompt_tokens_processed = done.timings.prompt_n
        slot.n_prompt_tokens_cache = done.timings.cache_n
        self.metrics.record(done, engine.n_batch)
        job.emit(done)

    def _evaluate_only(self, job: Job) -> Done:
        """n_predict 0: put the prompt in the cache, generate nothing (llama-server's meaning)."""
        assert self.model is not None
        engine = self.model.engine
        if len(job.tokens) >= engine.n_ctx:
            raise ContextOverflow(len(job.tokens), engine.n_ctx)
        t0 = time.perf_counter()
        reuse = engine.evaluate(job.tokens)
        ms = (time.perf_counter() - t0) * 1e3
        timings = Timings(cache_n=reuse, prompt_n=len(job.tokens) - reuse, prompt_ms=ms)
        return Done("", "length", "limit", (), timings, len(job.tokens))

    def _shifter(self, job: Job) -> Callable[[list[int]], list[int] | None] | None:
        """How a reply that fills the window goes on; None: it stops there.

        A chat leaves out its oldest turns (ChatWindow). Otherwise, or when no whole turn is
        left to give, with --context-shift this is llama-server's shift: keep BOS + n_keep and
        drop half of what follows (n_discard). Either way the engine moves the kept KV cells
        instead of re-processing them.
        """
        window = job.window

        def halve(prompt: Sequence[int], generated: list[int]) -> list[int] | None:
            tokens = list(prompt) + generated[:-1]
            keep = 1 + (job.n_keep if job.n_keep >= 0 else len(prompt))
            keep = min(keep, len(tokens) - 2)
            n_discard = (len(tokens) - keep) // 2
            if keep < 1 or n_discard <= 0:
                return None
            return tokens[:keep] + tokens[keep + n_discard :]

        def shift(generated: list[int]) -> list[int] | None:
            if window is not None:
                target = window.on_context_full(generated)
                if target is not None or not self.context_shift:
                    return target
                return halve(window.tokens, generated)
            return halve(job.tokens, generated)

        return shift if window is not None or self.context_shift else None


def _cancelled(n_prompt: int) -> Done:
    return Done("", "cancelled", "cancel", (), Timings(), n_prompt)
