"""The router's running models, loaded on demand and unloaded to make room, as llama-server's
router does (server-models.cpp), with memory deciding the room.

A request for a model that is not running joins a FIFO queue (requests for one model share an
entry); only the queue's head loads, once there is room: fewer than `--models-max` running and
the planner's memory for the model beside the running ones within the budget. Room is made by
unloading the least recently used idle model; a model with a request in progress is never
unloaded, so the queue waits for it. A model that does not fit the budget even alone is a 400
that says how much it needs. Each model's plan is made once, against the memory free before
it is loaded beside anything, and its server is held to it (`Cost.flags`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localfab.server import router_proc as proc
from localfab.server.errors import ApiError
from localfab.server.router_models import RouterModel
from localfab.server.router_proc import Cost, Instance
from localfab.units import format_bytes

__all__ = ["Cost", "Instance", "Pool"]

log = logging.getLogger("localfab.server")

# llama-server's test hook: a load and each proxied request wait 2 s, so tests can see queues.
FAKE_TIMING = "LLAMA_SERVER_DEBUG_FAKE_TIMING"


def unloaded_error(name: str, inst: Instance, while_: str) -> ApiError:
    """The 503 of a request whose model the router unloaded on purpose while it `while_`."""
    return ApiError(
        f"model name={name} was unloaded {inst.unloaded} while this request {while_}: "
        "send the request again to load it",
        "unavailable_error",
    )


@dataclass
class Waiting:
    """A queue entry: the requests waiting for one model to load."""

    name: str
    waiters: int = 0
    loading: bool = False


class Pool:
    """The models' processes, the queue and the room they need (all on the event loop)."""

    def __init__(
        self,
        models: dict[str, RouterModel],
        *,
        plan: Callable[[RouterModel], Cost],
        budget: dict[str, int],
        models_max: int,
        child_args: Sequence[str],
        resolve: Callable[[RouterModel], Path],
    ) -> None:
        self.models = models
        self.plan = plan
        self.budget = dict(budget)  # a device not named: its free memory at the first plan
        self.models_max = models_max
        self.child_args = list(child_args)
        self.resolve = resolve
        self.instances: dict[str, Instance] = {}
        self.queue: list[Waiting] = []
        self.changed = asyncio.Condition()
        self.reloading = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()
        self.fake_timing = bool(os.environ.get(FAKE_TIMING))

    # --- state ---------------------------------------------------------------------------------

    async def _cost(self, model: RouterModel) -> Cost:
        try:
            cost = await asyncio.to_thread(self.plan, model)
        except Exception as exc:  # a missing or broken file: this model cannot load, says why
            return proc.cost_error(exc)
        for device, free in cost.available.items():
            self.budget.setdefault(device, free)
        return cost

    async def prepare(self, name: str) -> Instance:
        """The model's instance, planned on first use (off the event loop)."""
        found = self.instances.get(name)
        if found is None:
            cost = await self._cost(self.models[name])
            found = self.instances.setdefault(name, Instance(self.models[name], cost))
        return found

    async def plan_all(self) -> None:
        """Plan every model whose file is at hand now, while nothing is loaded beside it."""
        for name, model in list(self.models.items()):
            if model.path is not None and name not in self.instances:
                await self.prepare(name)

    def status(self, name: str) -> str:
        inst = self.instances.get(name)
        return inst.status if inst is not None else "unloaded"

    def running(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.running]

    def used(self, device: str, without: Sequence[Instance] = ()) -> int:
        return sum(i.cost.devices.get(device, 0) for i in self.running() if i not in without)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def replace_models(self, models: dict[str, RouterModel]) -> None:
        """The sources read again. A model that is gone or changed is unloaded when idle (one
        with a request in progress finishes it first and is unloaded as any idle one later);
        a changed one loads with its new flags and plan next time."""
        async with self.reloading:
            for name, inst in list(self.instances.items()):
                new = models.get(name)
                same = new is not None and (new.path, new.hf_repo, new.args) == (
                    inst.model.path,
                    inst.model.hf_repo,
                    inst.model.args,
                )
                if same:
                    continue
                if inst.status == "loaded" and inst.busy == 0:
                    inst.unloaded = "because it changed in the model sources"
                    await proc.stop(inst, inst.model.stop_timeout)
                if new is not None:
                    inst.model, inst.cost = new, await self._cost(new)
            self.models = models
            await self.notify()

    # --- room ----------------------------------------------------------------------------------

    def check_fits_alone(self, inst: Instance) -> None:
        """A 400 for a model that the budget cannot hold even with nothing else loaded."""
        if not inst.cost.fits:
            raise ApiError(f"model {inst.model.id} cannot be loaded: {inst.cost.why_not}")
        for device, need in inst.cost.devices.items():
            have = self.budget.get(device)
            if have is not None and need > have:
                raise ApiError(
                    f"model {inst.model.id} needs {format_bytes(need)} of {device} memory "
                    f"({inst.cost.summary}), more than the router's budget of "
                    f"{format_bytes(have)} (--models-memory): it cannot be loaded"
                )

    def _short(self, inst: Instance, gone: Sequence[Instance]) -> bool:
        """Whether `inst` lacks room beside the running models, less those `gone`."""
        count = len([i for i in self.running() if i not in gone])
        if 0 < self.models_max <= count:
            return True
        return any(
            self.used(device, gone) + need > self.budget[device]
            for device, need in inst.cost.devices.items()
            if device in self.budget
        )

    def victims(self, inst: Instance) -> list[Instance] | None:
        """The idle models to unload, least recently used first, so that `inst` fits; None
        when the busy ones leave no way to (the queue waits for them)."""
        queued = {w.name for w in self.queue}
        idle = sorted(
            (
                i
                for i in self.running()
                if i.status == "loaded" and i.busy == 0 and not i.stopping
                and i.model.id not in queued
            ),
            key=lambda i: i.last_used,
        )  # fmt: skip
        chosen: list[Instance] = []
        while self._short(inst, chosen):
            if not idle:
                return None
            chosen.append(idle.pop(0))
        return chosen

    def eviction_note(self, inst: Instance, gone: Sequence[Instance]) -> str:
        now = time.monotonic()
        names = ", ".join(f"{g.model.id} (idle {now - g.last_used:.0f} s)" for g in gone)
        room = "; ".join(f"{d} budget {format_bytes(b)}" for d, b in self.budget.items())
        return f"unloaded {names} to load {inst.model.id} ({inst.cost.summary}; {room})"

    # --- loading -------------------------------------------------------------------------------

    async def _start(self, inst: Instance, gone: list[Instance]) -> str:
        """Load `inst` in place of `gone`. Called with the lock held; the instance is marked
        loading first (nothing else starts it), then the lock is let go while its file is
        found, the idle models stop and its server starts. Returns the eviction note."""
        note = self.eviction_note(inst, gone) if gone else ""
        if note:
            log.warning("router: %s", note)
        inst.status, inst.exit_code, inst.failure, inst.stopping = "loading", None, "", False
        inst.unloaded = ""
        inst.last_used = time.monotonic()
        for g in gone:
            g.unloaded = f"to make room for model {inst.model.id}"
        self.changed.release()
        try:
            path = await asyncio.to_thread(self.resolve, inst.model)
            await asyncio.gather(*(proc.stop(g, g.model.stop_timeout) for g in gone))
            if self.fake_timing:
                await asyncio.sleep(2)
            if inst.unloaded:  # unloaded before its server started: it never starts
                inst.status = "unloaded"
            else:
                await proc.spawn(inst, path, self.child_args, self.notify)
        except BaseException as exc:
            proc.failed(inst, exc)
            if not isinstance(exc, Exception):
                raise
            log.warning("router: %s could not be loaded: %s", inst.model.id, exc)
        finally:
            await self._reacquire()
        return note

    async def _reacquire(self) -> None:
        """Take the lock back, even when cancelled meanwhile (then re-raised, lock held)."""
        cancelled = False
        while True:
            try:
                await self.changed.acquire()
                break
            except asyncio.CancelledError:
                cancelled = True
        self.changed.notify_all()
        if cancelled:
            raise asyncio.CancelledError

    async def ensure_ready(self, name: str, gone: Callable[[], bool]) -> tuple[Instance, str]:
        """The model's instance once it is loaded, loading it in queue order; also the note of
        what was unloaded to make room ('' when nothing)."""
        inst = await self.prepare(name)
        self.check_fits_alone(inst)
        entry: Waiting | None = None
        tried, note = False, ""
        async with self.changed:
            try:
                while not (inst.status == "loaded" and not inst.stopping):
                    if inst.status == "loading":
                        tried = True
                    elif inst.stopping:
                        pass  # unloading: it loads again once it has exited
                    elif tried and inst.unloaded:
                        raise unloaded_error(name, inst, "waited for it to load")
                    elif tried and inst.exit_code not in (0, None):
                        why = f": {inst.failure}" if inst.failure else ""
                        raise ApiError(f"model name={name} failed to load{why}", "server_error")
                    else:
                        tried = False
                        entry = entry or self._join(name)
                        if self.queue[0] is entry and not entry.loading:
                            victims = self.victims(inst)
                            if victims is not None:
                                entry.loading = True
                                try:
                                    note = await self._start(inst, victims)
                                finally:
                                    entry.loading = False
                                tried = True
                                continue
                    if gone():
                        raise ApiError(f"request cancelled while waiting for model name={name}")
                    try:
                        async with asyncio.timeout(0.2):
                            await self.changed.wait()
                    except TimeoutError:
                        pass
                return inst, note
            finally:
                if entry is not None:
                    entry.waiters -= 1
                    if entry.waiters == 0:
                        self.queue.remove(entry)
                self.changed.notify_all()

    def _join(self, name: str) -> Waiting:
        entry = next((w for w in self.queue if w.name == name), None)
        if entry is None:
            entry = Waiting(name)
            self.queue.append(entry)
        entry.waiters += 1
        return entry

    async def load_now(self, name: str) -> str:
        """POST /models/load: start loading at once (no queue), unloading idle models for
        room; answers before the model is loaded (GET /models says when)."""
        inst = await self.prepare(name)
        if self.fake_timing:
            await asyncio.sleep(2)
        async with self.changed:
            if inst.running:
                raise ApiError("model is already running")
            self.check_fits_alone(inst)
            victims = self.victims(inst)
            if victims is None:
                raise ApiError("model limit reached, try again later", "server_error")
            note = await self._start(inst, victims)
            if inst.status != "loading" and inst.unloaded:
                raise unloaded_error(name, inst, "was loading it")
            if inst.status != "loading":
                raise ApiError(f"model name={name} failed to load: {inst.failure}", "server_error")
            return note

    def unload(self, inst: Instance, why: str) -> None:
        """POST /models/unload: ask the model's server to exit (in the background); a load in
        progress is given up. `why` says why, to the requests that wait for it."""
        inst.unloaded = why
        task = asyncio.get_running_loop().create_task(proc.stop(inst, inst.model.stop_timeout))
        proc.keep(self.tasks, task)

    async def close(self) -> None:
        await asyncio.gather(*(proc.stop(i, 10) for i in self.running()))
