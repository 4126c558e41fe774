"""The server's one runner: queued jobs run on the engine's slots, one batch per step.

With `-np N` the engine's context holds N sequences (one with `-np 1`, run the same way). The
engine thread takes jobs from the worker's queue as slots free up: a job goes to the idle slot
whose cache shares the longest prefix with its prompt (as llama-server does), then every step
decodes the next token of every running reply together with a chunk of any prompt being
processed (`engine.batch`). Calls queued for the engine (tokenize, detokenize) run between
steps, so they never wait for a reply to end. A job whose client went away is stopped within
one step and its slot freed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from localfab.engine.batch import BatchDecoder
from localfab.engine.prompt_cache import PromptCache
from localfab.engine.slots import Slot
from localfab.engine.types import ContextFull, Done
from localfab.errors import LocalfabError
from localfab.ledger.writer import TokenClock
from localfab.machine.energy import Energy, Measurement
from localfab.server.errors import api_error
from localfab.server.jobs import (
    Job,
    JobRun,
    SlotView,
    cancelled_result,
    empty_result,
    prompt_only,
)
from localfab.server.metrics import Metrics

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.ledger.writer import LedgerWriter
    from localfab.runtime import LoadedModel

log = logging.getLogger("localfab.server")

__all__ = ["STOP", "JobQueue", "SlotRunner"]

#: Queued by the worker to end the runner.
STOP = object()


class JobQueue(Protocol):
    """What the runner needs of the worker that feeds it (`worker.EngineWorker`)."""

    ledger: LedgerWriter | None
    metrics: Metrics
    slots: list[SlotView]
    prompt_cache: PromptCache
    cache_idle_slots: bool

    @property
    def stopping(self) -> bool: ...

    def take(self, block: bool) -> Any: ...

    def run_call(self, item: tuple[Callable[[LoadedModel], Any], Any]) -> None: ...

    def finished(self, job: Job) -> None: ...

    def died(self, exc: BaseException) -> None: ...

    def shifter(self, job: Job) -> ContextFull | None: ...

    def measurement(self) -> Measurement | None: ...

    def record(
        self, job: Job, done: Done, clock: TokenClock | None, energy: Energy | None
    ) -> None: ...


@dataclass(eq=False)
class _Active:
    """A job running on a slot, and its bookkeeping."""

    job: Job
    run: JobRun
    view: SlotView
    evaluated: int = 0  # prompt tokens in the cache at the last progress report
    # The reply's energy, measured while it is the only one running (see `_measure`).
    measurement: Measurement | None = None


class SlotRunner:
    """Runs the worker's jobs on the engine's slots until the worker stops."""

    def __init__(self, worker: JobQueue, engine: Engine, n_slots: int) -> None:
        self.worker = worker
        self.engine = engine
        self.decoder = BatchDecoder(self.engine, n_slots)
        for slot in self.decoder.slots:
            slot.kv.prompt_cache = worker.prompt_cache
        self.waiting: deque[Job] = deque()
        self.active: dict[int, _Active] = {}

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        crashed = False
        try:
            while self._take():
                self._admit()
                if self.decoder.busy:
                    self._step()
        except BaseException as exc:
            # The worker tells every job waiting or running that the engine stopped, and why
            # (a job ended as "cancelled" would look like a reply that was merely cut short).
            crashed = True
            self.worker.died(exc)
            raise
        finally:
            for act in self.active.values():
                if act.measurement is not None:
                    act.measurement.__exit__(None, None, None)
            if not crashed:
                for job in self.waiting:
                    job.emit(cancelled_result(len(job.tokens)))
                for act in self.active.values():
                    act.job.emit(cancelled_result(len(act.job.tokens)))
                    self.worker.finished(act.job)
                self._persist_slots()
            self.decoder.close()

    def _persist_slots(self) -> None:
        """At shutdown, with a disk tier (`--cache-disk`): each slot's prompt to the cache
        folder, found again by the next start."""
        if self.worker.prompt_cache.disk is None:
            return
        for slot in self.decoder.slots:
            try:
                slot.kv.persist()
            except LocalfabError as exc:  # never stops the shutdown
                log.warning("prompt cache: could not keep a slot's prompt (%s)", exc)

    def _take(self) -> bool:
        """Move queued items in: jobs to `waiting`, calls run now. Blocks only when nothing
        runs or waits. False once the worker stops."""
        block = not self.decoder.busy and not self.waiting
        while True:
            item = self.worker.take(block)
            if item is None:
                return True
            if item is STOP:
                return False
            if isinstance(item, tuple):
                self.worker.run_call(item)
            else:
                self.waiting.append(item)
            block = False

    def _admit(self) -> None:
        """Start waiting jobs, in order, while slots are free. A job that asked for a slot
        that is busy (`id_slot`) waits for it; the jobs behind it go on."""
        for job in list(self.waiting):
            if job.cancel.is_set() or self.worker.stopping:
                self.waiting.remove(job)
                self._answer(job, cancelled_result(len(job.tokens)))
                continue
            if not job.tokens:
                self.waiting.remove(job)
                self._answer(job, empty_result())
                continue
            if not self.decoder.idle():
                return
            slot, leader = self._slot_for(job)
            if slot is None:
                continue  # its slot is busy
            self.waiting.remove(job)
            job.placed[0] = slot.id
            try:
                self._start(job, slot, leader)
            except LocalfabError as exc:
                self._fail(job, exc)
                continue
            try:
                self._cache_idle(slot)
            except LocalfabError as exc:  # the job runs on; the idle prompts stay where they are
                log.warning("prompt cache: could not keep the idle slots' prompts (%s)", exc)

    def _slot_for(self, job: Job) -> tuple[Slot | None, Slot | None]:
        """The idle slot for a job (None: the one it asked for is busy), and the slot whose
        prompt it shares (`n` > 1), if any."""
        slots = self.decoder.slots
        if job.id_slot >= 0:
            asked = slots[job.id_slot % len(slots)]
            return (None if asked.busy else asked), None
        leader = self._leader(job)
        return (self.decoder.pick(job.tokens) if leader is None else self._lru()), leader

    def _lru(self) -> Slot | None:
        idle = self.decoder.idle()
        return min(idle, key=lambda s: s.last_used) if idle else None

    def _leader(self, job: Job) -> Slot | None:
        """A slot still processing the same prompt for the same request (`n` > 1)."""
        if job.group < 0:
            return None
        for slot_id, act in self.active.items():
            slot = self.decoder.slots[slot_id]
            reply = slot.reply
            if (
                act.job.group == job.group
                and reply is not None
                and reply.pending < 0
                and reply.leader is None
                and reply.prompt == list(job.tokens)
            ):
                return slot
        return None

    def _start(self, job: Job, slot: Slot, leader: Slot | None) -> None:
        kv = slot.kv
        restored = None
        if not job.cache_prompt:
            kv.clear()
        elif leader is None:  # another chat's turn: keep this prompt, restore a kept one
            restored = kv.swap_with_cache(job.tokens)
        if job.n_predict == 0:
            self._evaluate_only(job, slot)
            return
        window = job.window
        if window is not None and window.shifted and kv.can_shift:
            # Turns were left out: move the kept ones' KV cells rather than process them.
            kv.align_to(job.tokens)
        view = SlotView.for_job(job)
        view.n_prompt_tokens_restored = 0 if restored is None else restored.n_tokens
        clock = TokenClock() if self.worker.ledger is not None else None
        run = JobRun(job, kv.cached, clock=clock)
        opts = replace(job.options, on_context_full=self.worker.shifter(job))
        if leader is None:
            self.decoder.start(slot, job.tokens, opts)
        else:
            self.decoder.follow(slot, leader, opts)
            run.cache = len(job.tokens)
        self.worker.slots[slot.id] = view
        act = _Active(job, run, view, evaluated=slot.n_evaluated)
        self._measure(act)
        self.active[slot.id] = act
        if job.return_progress:
            run.progress(run.cache)

    def _measure(self, act: _Active) -> None:
        """A reply's energy is measured while it runs alone: it starts when no other reply
        runs, and a reply that starts beside it ends the measurement (the energy is shared
        then, and no reply's own)."""
        for other in self.active.values():
            if other.measurement is not None:
                other.measurement.__exit__(None, None, None)
                other.measurement = None
        if self.active:
            return
        act.measurement = self.worker.measurement()
        if act.measurement is not None:
            act.measurement.__enter__()

    def _cache_idle(self, started: Slot) -> None:
        """llama-server's --cache-idle-slots: as a job starts, each idle slot's prompt goes to
        the prompt cache (unless a kept state holds it already), and with a unified KV pool the
        slot is emptied, so the running slots have the pool's room; a later request for that
        prompt restores it from the cache."""
        cache = self.worker.prompt_cache
        if not (self.worker.cache_idle_slots and cache.enabled):
            return
        unified = self.engine.settings.kv_unified
        for slot in self.decoder.idle():
            if slot is started or not slot.kv.cached:
                continue
            n = len(slot.kv.cached)
            if cache.worth_keeping(slot.kv.cached):
                cache.put(slot.kv.cached, slot.kv.save_state())
                log.info("prompt cache: kept idle slot %d's prompt (%d tokens)", slot.id, n)
            if unified:
                slot.kv.clear()
                log.info("slot %d: idle, its %d tokens left the shared KV pool", slot.id, n)

    def _evaluate_only(self, job: Job, slot: Slot) -> None:
        """n_predict 0: put the prompt in the slot's cache, generate nothing."""
        done = prompt_only(job, slot.kv.n_ctx, slot.kv.evaluate)
        self.decoder.touch(slot)
        self.worker.metrics.record(done, self.engine.n_batch)  # as the one-at-a-time path
        self._answer(job, done)

    # --- one step ----------------------------------------------------------------------------

    def _step(self) -> None:
        decoder = self.decoder
        n_decode, n_busy = decoder.n_decode, decoder.n_busy
        try:
            results = decoder.step()
        except Exception as exc:  # never let one step kill the engine thread
            log.exception("a decode step failed")
            error = (
                exc if isinstance(exc, LocalfabError) else LocalfabError(f"decoding failed: {exc}")
            )
            for slot in decoder.reset():
                self._fail(self._close(slot.id).job, error)
            return
        self.worker.metrics.record_step(decoder.n_decode - n_decode, decoder.n_busy - n_busy)
        for res in results:
            act = self.active.get(res.slot.id)
            if act is None:  # pragma: no cover - every busy slot has its job
                continue
            if res.error is not None:
                self._close(res.slot.id)
                self._fail(act.job, res.error)
                continue
            for event in res.events:
                if isinstance(event, Done):
                    self._done(res.slot.id, event)
                else:
                    act.run.on_token(event, act.view)
            if res.slot.id in self.active and act.job.cancel.is_set() and res.slot.reply:
                # Stopped by its time limit, or its client left: end it now, not a step later.
                for event in decoder.stop(res.slot):
                    if isinstance(event, Done):
                        self._done(res.slot.id, event)
                    else:
                        act.run.on_token(event, act.view)
        self._report_progress()

    def _report_progress(self) -> None:
        for slot_id, act in self.active.items():
            if not act.job.return_progress:
                continue
            slot = self.decoder.slots[slot_id]
            reply = slot.reply
            if reply is None or reply.pending >= 0:
                continue
            n = slot.n_evaluated
            if n != act.evaluated:
                act.evaluated = n
                act.run.progress(n)

    def _done(self, slot_id: int, done: Done) -> None:
        act = self._close(slot_id)
        done = act.run.finish(done)
        act.view.n_prompt_tokens_processed = done.timings.prompt_n
        act.view.n_prompt_tokens_cache = done.timings.cache_n
        act.view.generated = "".join(act.run.parts)
        energy = None
        if act.measurement is not None:  # ended by `_close`
            energy = act.measurement.energy
            if energy.joules is not None:
                timings = replace(done.timings, energy_j=energy.joules, energy_source=energy.source)
                done = replace(done, timings=timings)
        self.worker.metrics.record(done, self.engine.n_batch, decodes=False)
        self._answer(act.job, done)
        self.worker.record(act.job, done, act.run.clock, energy)

    def _close(self, slot_id: int) -> _Active:
        act = self.active.pop(slot_id)
        act.view.processing = False
        if act.measurement is not None:
            act.measurement.__exit__(None, None, None)
        return act

    def _answer(self, job: Job, done: Done) -> None:
        job.emit(done)
        self.worker.finished(job)

    def _fail(self, job: Job, exc: LocalfabError) -> None:
        job.emit(api_error(exc))
        self.worker.finished(job)
