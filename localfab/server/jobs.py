"""A server job and what its generation reports, as the engine thread sees them.

A handler submits a `Job` (see `worker`) with an `emit` callback and awaits what it emits:
`Progress` while the prompt is processed (if asked), a `Step` per token, then `Done` (or an
`ApiError`). `JobRun` keeps one running job's bookkeeping (progress, live timings, the time
limit); `SlotView` is what /slots shows of a slot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localfab.engine.image_ids import HeldTokens, ImageHold
from localfab.engine.prompt_cache import common_prefix
from localfab.engine.types import Done, GenerationOptions, Timings, TokenEvent
from localfab.errors import ContextOverflow
from localfab.ledger.writer import TokenClock
from localfab.server.chat_window import ChatWindow
from localfab.server.errors import ApiError


@dataclass(frozen=True)
class Progress:
    """How far prompt processing is (llama-server's `prompt_progress`)."""

    total: int
    cache: int
    processed: int
    time_ms: int
    prompt_ms: float = 0.0  # the prompt's time so far (0 before its first batch)

    def timings(self) -> dict[str, Any]:
        """llama-server's `timings` of a progress chunk (with timings_per_token)."""
        return Timings(
            cache_n=self.cache, prompt_n=self.processed - self.cache, prompt_ms=self.prompt_ms
        ).to_dict()

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
    """One generation request waiting for (or holding) a slot: what to generate
    (`options`, whose `cancel` is the job's own) and what the server adds to it."""

    id: int
    tokens: Sequence[int]
    options: GenerationOptions
    emit: Emit
    cache_prompt: bool = True
    n_keep: int = 0
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
    # The slot the job ran on, filled in by the engine thread before its Done (for `id_slot`).
    placed: list[int] = field(default_factory=lambda: [0])
    shifted: list[bool] = field(default_factory=lambda: [False])  # the window moved mid-reply

    def __post_init__(self) -> None:
        if self.options.cancel is None:  # every job can be cancelled (a client that left)
            object.__setattr__(self, "options", replace(self.options, cancel=threading.Event()))
        if isinstance(self.tokens, HeldTokens):  # its images stay prepared until it ends
            object.__setattr__(self, "emit", _leaving(self.emit, self.tokens.hold))

    @property
    def cancel(self) -> threading.Event:
        """Set to stop the job at its next token (or before it starts)."""
        assert self.options.cancel is not None
        return self.options.cancel

    @property
    def n_predict(self) -> int:
        return self.options.max_tokens


def _leaving(emit: Emit, hold: ImageHold) -> Emit:
    """`emit`, letting go of the prompt's images once the job has ended (its Done or error)."""
    hold.enter()
    left = threading.Event()

    def emit_and_leave(event: Progress | Step | Done | ApiError) -> None:
        try:
            emit(event)
        finally:
            if isinstance(event, Done | ApiError) and not left.is_set():
                left.set()
                hold.leave()

    return emit_and_leave


@dataclass
class SlotView:
    """What /slots shows about the last (or current) job."""

    id_task: int = -1
    processing: bool = False
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_prompt_tokens_cache: int = 0
    n_prompt_tokens_restored: int = 0  # of the cached ones, those the prompt cache gave back
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


def cancelled_result(n_prompt: int) -> Done:
    """The Done of a job cancelled before it ran."""
    return Done("", "cancelled", "cancel", (), Timings(), n_prompt)


def shared_prefix(cached: Sequence[int], tokens: Sequence[int]) -> int:
    """How many prompt tokens the engine will take from its cache (it keeps the last one of a
    wholly cached prompt out, to have logits to sample from)."""
    lcp = common_prefix(cached, tokens)
    return lcp - 1 if lcp == len(tokens) and lcp > 0 else lcp


class JobRun:
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
        elapsed = (time.perf_counter() - self.t_start) * 1e3
        prompt_ms = elapsed if processed > self.cache else 0.0
        self.job.emit(
            Progress(len(self.job.tokens), self.cache, processed, int(elapsed), prompt_ms)
        )

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
