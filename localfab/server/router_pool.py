"""The router's running models: one `localfab serve` process each, loaded on demand, unloaded to
make room, as llama-server's router does (server-models.cpp), with memory deciding the room.

A request for a model that is not running joins a FIFO queue (requests for one model share an
entry); only the queue's head loads, once there is room: fewer than `--models-max` running and
the planner's memory for the model beside the running ones within the budget. Room is made by
unloading the least recently used idle model; a model with a request in progress is never
unloaded, so the queue waits for it. A model that does not fit the budget even alone is a 400
that says how much it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from localfab.server.errors import ApiError
from localfab.server.router_models import RouterModel
from localfab.units import format_bytes

log = logging.getLogger("localfab.server")

# llama-server's test hook: a load and each proxied request wait 2 s, so tests can see queues.
FAKE_TIMING = "LLAMA_SERVER_DEBUG_FAKE_TIMING"


@dataclass(frozen=True)
class Cost:
    """What the planner puts on each device for a model (bytes), and its plan's summary."""

    devices: dict[str, int]
    summary: str
    fits: bool = True
    why_not: str = ""
    available: dict[str, int] = field(default_factory=dict)  # free per device when planned


@dataclass
class Instance:
    """A model's server process and its state: loading, loaded, stopping or unloaded."""

    model: RouterModel
    cost: Cost
    status: str = "unloaded"
    proc: asyncio.subprocess.Process | None = None
    port: int = 0
    busy: int = 0
    last_used: float = 0.0
    exit_code: int | None = None
    stopping: bool = False
    args: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")


@dataclass
class Waiting:
    """A queue entry: the requests waiting for one model to load."""

    name: str
    waiters: int = 0
    loading: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        self.budget = budget
        self.models_max = models_max
        self.child_args = list(child_args)
        self.resolve = resolve
        self.instances: dict[str, Instance] = {}
        self.queue: list[Waiting] = []
        self.changed = asyncio.Condition()
        self.fake_timing = bool(os.environ.get(FAKE_TIMING))

    # --- state -------------------------------------------------------------------------------

    def instance(self, name: str) -> Instance:
        found = self.instances.get(name)
        if found is None:
            model = self.models[name]
            found = self.instances[name] = Instance(model, self.plan(model))
            if not self.budget:  # default: the memory free before anything was loaded
                self.budget = dict(found.cost.available)
        return found

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
        """The sources read again: a running model that is gone or whose file or flags changed
        is unloaded (and waited for); the others keep their state."""
        changed = [
            inst
            for name, inst in self.instances.items()
            if name not in models
            or (models[name].path, models[name].hf_repo, models[name].args)
            != (inst.model.path, inst.model.hf_repo, inst.model.args)
        ]
        await asyncio.gather(*(self.stop(inst) for inst in changed if inst.running))
        for inst in changed:
            del self.instances[inst.model.id]
        self.models = models
        await self.notify()

    # --- room ----------------------------------------------------------------------------------

    def check_fits_alone(self, inst: Instance) -> None:
        """A 400 for a model that the budget cannot hold even with nothing else loaded."""
        if not inst.cost.fits:
            raise ApiError(f"model {inst.model.id} does not fit this machine: {inst.cost.why_not}")
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
            self.used(device, gone) + need > self.budget.get(device, need + self.used(device))
            for device, need in inst.cost.devices.items()
        )

    def victims(self, inst: Instance) -> list[Instance] | None:
        """The idle models to unload, least recently used first, so that `inst` fits; None
        when the busy ones leave no way to (the queue waits for them)."""
        chosen: list[Instance] = []
        idle = sorted(
            (i for i in self.running() if i.busy == 0 and not i.stopping and i.status == "loaded"),
            key=lambda i: i.last_used,
        )
        queued = {w.name for w in self.queue}
        idle = [i for i in idle if i.model.id not in queued]
        while self._short(inst, chosen):
            if not idle:
                return None
            chosen.append(idle.pop(0))
        return chosen

    def eviction_note(self, inst: Instance, gone: Sequence[Instance]) -> str:
        names = ", ".join(
            f"{g.model.id} (idle {time.monotonic() - g.last_used:.0f} s)" for g in gone
        )
        room = "; ".join(f"{d} budget {format_bytes(b)}" for d, b in self.budget.items())
        return f"unloaded {names} to load {inst.model.id} ({inst.cost.summary}; {room})"

    # --- processes -----------------------------------------------------------------------------

    async def spawn(self, inst: Instance) -> None:
        path = self.resolve(inst.model)
        inst.port = free_port()
        inst.args = [
            sys.executable, "-m", "localfab", "serve", "-m", str(path),
            "--host", "127.0.0.1", "--port", str(inst.port), "--alias", inst.model.id,
            *self.child_args, *inst.model.args,
        ]  # fmt: skip
        inst.status, inst.exit_code, inst.stopping = "loading", None, False
        inst.last_used = time.monotonic()
        inst.proc = await asyncio.create_subprocess_exec(
            *inst.args, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        asyncio.get_running_loop().create_task(self._watch(inst, inst.proc))

    async def _watch(self, inst: Instance, proc: asyncio.subprocess.Process) -> None:
        """Marks the instance loaded once its /health answers, unloaded once it exits."""
        url = f"http://127.0.0.1:{inst.port}/health"
        async with httpx.AsyncClient(timeout=2) as client:
            while proc.returncode is None and inst.status == "loading":
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        inst.status = "loaded"
                        log.info("router: %s loaded on port %d", inst.model.id, inst.port)
                        await self.notify()
                        break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.1)
        code = await proc.wait()
        if inst.proc is proc:
            inst.status, inst.exit_code, inst.proc = "unloaded", code, None
            inst.busy = 0
            if code not in (0, -signal.SIGTERM) and not inst.stopping:
                log.warning("router: %s exited with code %d", inst.model.id, code)
            inst.stopping = False
            await self.notify()

    async def stop(self, inst: Instance, grace: float | None = None) -> None:
        proc = inst.proc
        if proc is None or proc.returncode is not None:
            return
        inst.stopping = True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM if inst.status == "loaded" else signal.SIGKILL)
        limit = inst.model.stop_timeout if grace is None else grace
        try:
            await asyncio.wait_for(proc.wait(), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(i, 10) for i in self.running()))

    # --- scheduling ----------------------------------------------------------------------------

    async def ensure_ready(self, name: str, gone: Callable[[], bool]) -> tuple[Instance, str]:
        """The model's instance once it is loaded, loading it in queue order; also the note of
        what was unloaded to make room ('' when nothing)."""
        inst = self.instance(name)
        self.check_fits_alone(inst)
        entry: Waiting | None = None
        tried, note = False, ""
        async with self.changed:
            try:
                while not (inst.status == "loaded" and not inst.stopping):
                    if inst.status == "loading":
                        tried = True
                    elif inst.status == "unloaded":
                        if tried and inst.exit_code not in (0, None):
                            raise ApiError(f"model name={name} failed to load", "server_error")
                        tried = False
                        if entry is None:
                            entry = self._join(name)
                        if self.queue[0] is entry and not entry.loading:
                            done = await self._load_head(inst, entry)
                            if done is not None:
                                tried, note = True, done
                                continue
                    if gone():
                        raise ApiError(f"request cancelled while waiting for model name={name}")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), 0.2)
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

    async def _load_head(self, inst: Instance, entry: Waiting) -> str | None:
        """Loads the queue's head if there is room (unloading idle models); None when there is
        none yet. Called with the lock held; releases it while processes stop and start."""
        gone = self.victims(inst)
        if gone is None:
            return None
        note = self.eviction_note(inst, gone) if gone else ""
        if note:
            log.warning("router: %s", note)
        entry.loading = True
        self.changed.release()
        try:
            await asyncio.gather(*(self.stop(g) for g in gone))
            if self.fake_timing:
                await asyncio.sleep(2)
            await self.spawn(inst)
        finally:
            await self.changed.acquire()
            entry.loading = False
        return note

    async def load_now(self, name: str) -> str:
        """POST /models/load: start loading at once (no queue), unloading idle models for room."""
        inst = self.instance(name)
        if inst.running:
            raise ApiError("model is already running")
        self.check_fits_alone(inst)
        if self.fake_timing:
            await asyncio.sleep(2)
        gone = self.victims(inst)
        if gone is None:
            raise ApiError("model limit reached, try again later", "server_error")
        note = self.eviction_note(inst, gone) if gone else ""
        if note:
            log.warning("router: %s", note)
        await asyncio.gather(*(self.stop(g) for g in gone))
        await self.spawn(inst)
        return note
