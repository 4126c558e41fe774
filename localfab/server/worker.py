"""The one thread that owns the engine: loads the model, then runs queued jobs in order.

The engine is not thread-safe, so every generation (and every call that touches the engine's
shared buffers) goes through this thread's FIFO queue. With one slot the thread runs one job at a
time on `Engine.stream` (speculative decoding included); with several (`-np`) it runs them
together, one batch per step (`slots.SlotRunner`). The asyncio
side submits a job with an `emit` callback and awaits what it emits: `Progress` while the prompt
is processed (if asked), a `Step` per token, then `Done` (or an `ApiError`). A job's `cancel`
Event stops its generation at the next token (a client that went away frees the engine at once).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from localfab.energy import Energy, EnergyMeter, Measurement
from localfab.engine.types import (
    ContextFull,
    Done,
    GenerationOptions,
    SamplingParams,
    Timings,
    TokenEvent,
)
from localfab.errors import ContextOverflow, LocalfabError
from localfab.ledger import LedgerWriter, TokenClock, record_generation
from localfab.server.chat_window import ChatWindow
from localfab.server.errors import ApiError, api_error
from localfab.server.reply_shift import ReplyShift

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel

log = logging.getLogger("localfab.server")


@dataclass(frozen=True)
class Progress:
    """How far prompt processing is (llama-server's `prompt_progress`)."""

    total: int
    cache: int
    processed: int
    time_ms: int

    def to_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "cache": self.cache,
            "processed": self.processed,
            "time_ms": self.time_ms,
        }


@dataclass(frozen=True)
class Step:
    """One generated token; `timings` so far when the job asked for them per token."""

    event: TokenEvent
    timings: Timings | None = None


Emit = Callable[[Progress | Step | Done | ApiError], None]


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
    post_sampling_probs: bool = False  # n_probs from the sampler chain's output
    # A chat's messages fitted by whole turns (ChatWindow): it makes room for a reply that
    # fills the window.
    window: ChatWindow | None = None
    params: dict[str, Any] = field(default_factory=dict)
    return_progress: bool = False  # emit Progress while the prompt is processed
    timings_per_token: bool = False  # each Step carries the timings so far
    # > 0: stop once this many ms passed since the first token and a newline was generated.
    t_max_predict_ms: int = -1
    # Jobs of one request with the same prompt (`n` > 1) share a group: with parallel slots the
    # prompt is evaluated once and its KV cells copied. -1: none.
    group: int = -1
    id_slot: int = -1  # the slot asked for (llama-server's `id_slot`, modulo the slots)
    cancel: threading.Event = field(default_factory=threading.Event)
    # The slot the job ran on, filled in by the engine thread before its Done (for `id_slot`).
    placed: list[int] = field(default_factory=lambda: [0])

    def options(self, on_context_full: ContextFull | None) -> GenerationOptions:
        """What the engine generates for this job."""
        return GenerationOptions(
            max_tokens=self.n_predict,
            sampling=self.sampling,
            stop=self.stop,
            cancel=self.cancel,
            on_context_full=on_context_full,
            n_probs=self.n_probs,
            post_sampling_probs=self.post_sampling_probs,
        )


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
    n_busy_slots_total: int = 0  # busy slots summed over llama_decode() calls
    n_tokens_max: int = 0
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    draft_verifies_total: int = 0
    # Since the last scrape (llama-server's "bucket" gauges). Generation rates count decode
    # steps: the first token of a reply comes with the prompt's last batch, so it is left out.
    bucket_prompt_n: int = 0
    bucket_prompt_s: float = 0.0
    bucket_predicted_steps: int = 0
    bucket_predicted_s: float = 0.0

    def record(self, done: Done, n_batch: int, *, decodes: bool = True) -> None:
        """Count a finished reply; `decodes`: also the llama_decode calls it took, when one
        sequence decodes at a time (with parallel slots they are counted per step instead,
        `record_step`)."""
        t = done.timings
        steps = max(t.predicted_n - 1, 0)
        self.prompt_tokens_total += t.prompt_n
        self.prompt_tokens_cached_total += t.cache_n
        self.prompt_seconds_total += t.prompt_ms / 1e3
        self.tokens_predicted_total += t.predicted_n
        self.tokens_predicted_seconds_total += t.predicted_ms / 1e3
        if decodes:
            n_decode = -(-t.prompt_n // max(n_batch, 1)) + steps
            self.record_step(n_decode, n_decode)  # one sequence decodes at a time
        self.n_tokens_max = max(self.n_tokens_max, done.prompt_tokens + t.predicted_n)
        self.draft_tokens_total += t.draft_n
        self.draft_accepted_total += t.draft_n_accepted
        self.draft_verifies_total += t.draft_verifies
        self.bucket_prompt_n += t.prompt_n
        self.bucket_prompt_s += t.prompt_ms / 1e3
        self.bucket_predicted_steps += steps
        self.bucket_predicted_s += t.predicted_ms / 1e3

    def record_step(self, n_decode: int, n_busy: int) -> None:
        """`n_decode` llama_decode calls with `n_busy` busy slots summed over them."""
        self.n_decode_total += n_decode
        self.n_busy_slots_total += n_busy

    def reset_bucket(self) -> None:
        self.bucket_prompt_n = self.bucket_predicted_steps = 0
        self.bucket_prompt_s = self.bucket_predicted_s = 0.0


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

    @classmethod
    def for_job(cls, job: Job) -> SlotView:
        """The view of a slot that starts running `job`."""
        return cls(
            id_task=job.id,
            processing=True,
            n_prompt_tokens=len(job.tokens),
            n_predict=job.n_predict,
            params=job.params,
            prompt=job.tokens,
        )


_STOP = object()


class EngineWorker:
    """Owns the LoadedModel; `ready` is set once it is loaded (or `load_error` once it failed)."""

    def __init__(
        self,
        source: LoadedModel | Callable[[], LoadedModel],
        *,
        context_shift: bool = False,
        ledger: LedgerWriter | None = None,
        n_parallel: int = 1,
    ) -> None:
        self._source = source
        self.context_shift = context_shift
        # Each reply's figures go to the usage ledger (`localfab stats`), with the energy it
        # took where the machine reports power; None: nothing is measured or recorded.
        self.ledger = ledger
        self._meter: EnergyMeter | None = None
        self._recorded: tuple[TokenClock | None, Energy] | None = None  # the last reply's
        self.model: LoadedModel | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.metrics = Metrics()
        # What /slots shows, one view per slot; with one slot, [0] is the job running (or last).
        self.n_parallel = max(n_parallel, 1)
        self.slots = [SlotView() for _ in range(self.n_parallel)]
        self.runner: Any = None  # the SlotRunner while parallel slots run
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
        # As many slots as asked for and the context has sequences (-np loads one per slot).
        n_seq = min(self.model.engine.n_seq_max, self.n_parallel)
        if n_seq > 1:
            from localfab.server.slots import SlotRunner

            self.runner = SlotRunner(self, n_seq)
            self.runner.run()
            return
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, tuple):
                self.run_call(item)
                continue
            try:
                self._run(item)
            except BaseException as exc:  # never let one request kill the engine thread
                log.exception("generation failed")
                item.emit(api_error(exc, failed="generation failed"))
            finally:
                with self._lock:
                    self._pending.discard(item)

    def take(self, block: bool) -> Any:
        """The next queued item (a Job, a call, or the stop mark); None when empty and not
        `block`."""
        try:
            return self._queue.get(block)
        except queue.Empty:
            return None

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

    def _run(self, job: Job) -> None:
        assert self.model is not None
        engine = self.model.engine
        if job.cancel.is_set() or self._stopping:
            job.emit(_cancelled(len(job.tokens)))
            return
        slot = SlotView.for_job(job)
        self.slots[0] = slot
        if not job.cache_prompt:
            engine.clear_cache()
        try:
            done = self._generate(job, slot)
        except LocalfabError as exc:
            job.emit(api_error(exc))
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
        if self._recorded is not None:
            self.record(job, done, *self._recorded)

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

    def _generate(self, job: Job, slot: SlotView) -> Done | None:
        assert self.model is not None
        engine = self.model.engine
        if not job.tokens:
            return empty_result()
        if job.n_predict == 0:
            return prompt_only(job, engine.n_ctx, engine.evaluate)
        if job.window is not None and job.window.left_out["turns"] and engine.can_shift:
            # Turns were left out: move the kept ones' KV cells rather than process them.
            engine.shift_to(job.tokens)
        run = _Run(job, engine.cached_tokens, clock=TokenClock() if self.ledger else None)
        self._recorded = None
        measurement = self._measurement()
        with measurement or contextlib.nullcontext():
            run.prefill(engine.evaluate, engine.n_batch)
            done: Done | None = None
            for event in engine.stream(job.tokens, job.options(self.shifter(job))):
                if isinstance(event, Done):
                    done = event
                    break
                run.on_token(event, slot)
        slot.generated = "".join(run.parts)
        if done is None:
            return None
        if measurement is not None:
            energy = measurement.energy
            self._recorded = (run.clock, energy)
            if energy.joules is not None:
                timings = replace(done.timings, energy_j=energy.joules, energy_source=energy.source)
                done = replace(done, timings=timings)
        return run.finish(done)

    def _measurement(self) -> Measurement | None:
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
        return ReplyShift(job.tokens, job.n_keep, job.window) if self.context_shift else None


def empty_result() -> Done:
    """llama-server answers an empty prompt with an empty result."""
    return Done("", "length", "none", (), Timings(), 0)


def prompt_only(job: Job, n_ctx: int, evaluate: Callable[[Sequence[int]], int]) -> Done:
    """n_predict 0: put the prompt in the cache, generate nothing (llama-server's meaning)."""
    if len(job.tokens) >= n_ctx:
        raise ContextOverflow(len(job.tokens), n_ctx)
    t0 = time.perf_counter()
    reuse = evaluate(job.tokens)
    ms = (time.perf_counter() - t0) * 1e3
    timings = Timings(cache_n=reuse, prompt_n=len(job.tokens) - reuse, prompt_ms=ms)
    return Done("", "length", "limit", (), timings, len(job.tokens))


def _cancelled(n_prompt: int) -> Done:
    return Done("", "cancelled", "cancel", (), Timings(), n_prompt)


def shared_prefix(cached: Sequence[int], tokens: Sequence[int]) -> int:
    """How many prompt tokens the engine will take from its cache (it keeps the last one of a
    wholly cached prompt out, to have logits to sample from)."""
    n = min(len(cached), len(tokens))
    lcp = 0
    while lcp < n and cached[lcp] == tokens[lcp]:
        lcp += 1
    return lcp - 1 if lcp == len(tokens) and lcp > 0 else lcp


class _Run:
    """One generation's bookkeeping on the engine thread: progress, live timings, time limit."""

    def __init__(self, job: Job, cached: Sequence[int], *, clock: TokenClock | None = None) -> None:
        self.job = job
        self.clock = clock  # token arrival times, for the usage ledger
        self.t_start = time.perf_counter()
        self.cache = shared_prefix(cached, job.tokens) if job.cache_prompt else 0
        self.prefill_ms = 0.0  # prompt batches evaluated before the engine's stream
        self.t_first = 0.0
        self.n_decoded = 0
        self.has_new_line = False
        self.timed_out = False
        self.parts: list[str] = []
        self.live_ms = 0.0  # predicted_ms of the last per-token timings sent

    def progress(self, processed: int) -> None:
        ms = int((time.perf_counter() - self.t_start) * 1e3)
        self.job.emit(Progress(len(self.job.tokens), self.cache, processed, ms))

    def prefill(self, evaluate: Callable[[Sequence[int]], int], n_batch: int) -> None:
        """With return_progress: a progress event at the start and after every prompt batch
        but the last (which the engine's stream evaluates, then samples)."""
        job = self.job
        if not job.return_progress:
            return
        self.progress(self.cache)
        done = self.cache
        while len(job.tokens) - done > n_batch and not job.cancel.is_set():
            done += n_batch
            evaluate(job.tokens[:done])
            self.progress(done)
        self.prefill_ms = (time.perf_counter() - self.t_start) * 1e3

    def on_token(self, event: TokenEvent, slot: SlotView) -> None:
        job = self.job
        now = time.perf_counter()
        if self.clock is not None:
            self.clock.tick(now)
        if not self.t_first:
            self.t_first = now
            if job.return_progress:
                self.progress(len(job.tokens))
        self.n_decoded += 1
        slot.n_decoded = self.n_decoded
        if event.text:
            self.parts.append(event.text)
            if "\n" in event.text:
                self.has_new_line = slot.has_new_line = True
        live = self.timings(now) if job.timings_per_token else None
        if live is not None:
            self.live_ms = live.predicted_ms
        job.emit(Step(event, live))
        limit = job.t_max_predict_ms
        if limit > 0 and self.has_new_line and (now - self.t_first) * 1e3 > limit:
            self.timed_out = True
            job.cancel.set()  # the engine stops after this token

    def timings(self, now: float) -> Timings:
        """The timings so far, defined as the final ones."""
        return Timings(
            cache_n=self.cache,
            prompt_n=len(self.job.tokens) - self.cache,
            prompt_ms=(self.t_first - self.t_start) * 1e3,
            predicted_n=self.n_decoded,
            predicted_ms=(now - self.t_first) * 1e3,
            ttft_ms=(self.t_first - self.t_start) * 1e3,
        )

    def finish(self, done: Done) -> Done:
        if self.timed_out and done.stop_type == "cancel":
            # llama-server ends a reply over t_max_predict_ms as a limit stop.
            done = replace(done, finish_reason="length", stop_type="limit")
        if self.prefill_ms and done.timings.cache_n != self.cache:
            t = done.timings
            done = replace(
                done,
                timings=replace(
                    t,
                    cache_n=self.cache,
                    prompt_n=len(self.job.tokens) - self.cache,
                    prompt_ms=t.prompt_ms + self.prefill_ms,
                    ttft_ms=t.ttft_ms + self.prefill_ms,
                ),
            )
        if done.timings.predicted_ms < self.live_ms:
            # The per-token timings are taken when the token reaches this thread, the final
            # ones by the engine; on parallel slots a step's tokens arrive together, a little
            # after they were sampled. A client sees time go forward, never back.
            done = replace(done, timings=replace(done.timings, predicted_ms=self.live_ms))
        return done
