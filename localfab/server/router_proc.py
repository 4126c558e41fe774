"""A router's model processes: each a `localfab serve` on a loopback port of its own, started,
watched until it answers /health, stopped gracefully (then killed); none outlives the router."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from localfab.server.router_models import RouterModel

log = logging.getLogger("localfab.server")
_WATCHERS: set[asyncio.Task[Any]] = set()  # each model server's watcher, held while it runs


@dataclass(frozen=True)
class Cost:
    """What the planner puts on each device for a model (bytes), its plan's summary, and the
    flags that hold its server to that plan (-c, -ngl)."""

    devices: dict[str, int]
    summary: str
    fits: bool = True
    why_not: str = ""
    available: dict[str, int] = field(default_factory=dict)  # free per device when planned
    flags: tuple[str, ...] = ()


@dataclass
class Instance:
    """A model's server process and its state: unloaded, loading (from the moment a load is
    decided, so nothing else starts it) or loaded; `stopping` while it is asked to exit."""

    model: RouterModel
    cost: Cost
    status: str = "unloaded"
    proc: asyncio.subprocess.Process | None = None
    port: int = 0
    busy: int = 0  # requests in progress (each forward adds one and takes it back once)
    last_used: float = 0.0
    exit_code: int | None = None
    failure: str = ""  # why the last load failed
    unloaded: str = ""  # why the router unloaded it on purpose since its last load began
    stopping: bool = False
    args: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_router() -> None:
    """In the child, before exec: SIGTERM when the router dies, however it dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def command(inst: Instance, path: Path, shared: Sequence[str]) -> list[str]:
    """The model's server command: the router's flags, the model's own, its plan's, then the
    address and name the router gives it (last: a preset cannot move or rename it)."""
    return [
        sys.executable, "-m", "localfab", "serve", "-m", str(path),
        *shared, *inst.model.args, *inst.cost.flags,
        "--host", "127.0.0.1", "--port", str(inst.port), "--alias", inst.model.id,
    ]  # fmt: skip


async def spawn(
    inst: Instance, path: Path, shared: Sequence[str], notify: Callable[[], Awaitable[None]]
) -> None:
    """Start the model's server; a task marks it loaded once /health answers, unloaded once it
    exits (a load that ends before it answered is a failure)."""
    inst.port = free_port()
    inst.args = command(inst, path, shared)
    linux = sys.platform.startswith("linux")
    inst.proc = await asyncio.create_subprocess_exec(
        *inst.args,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_router if linux else None,
    )
    inst.last_used = time.monotonic()
    keep(_WATCHERS, asyncio.get_running_loop().create_task(_watch(inst, inst.proc, notify)))


async def _watch(
    inst: Instance, proc: asyncio.subprocess.Process, notify: Callable[[], Awaitable[None]]
) -> None:
    url = f"http://127.0.0.1:{inst.port}/health"
    async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
        while proc.returncode is None and inst.status == "loading":
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    inst.status = "loaded"
                    log.info("router: %s loaded on port %d", inst.model.id, inst.port)
                    await notify()
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.1)
    code = await proc.wait()
    if inst.proc is not proc:
        return
    if inst.status == "loading" and not inst.stopping:
        inst.failure = f"its server exited with code {code} before it answered"
        code = code or -1  # gone before it loaded: a failure even with 0
        log.warning("router: %s failed to load (exit code %d)", inst.model.id, code)
    elif code not in (0, -signal.SIGTERM) and not inst.stopping:
        log.warning("router: %s exited with code %d", inst.model.id, code)
    inst.status, inst.exit_code, inst.proc, inst.stopping = "unloaded", code, None, False
    await notify()


async def stop(inst: Instance, grace: float) -> None:
    """Ask the model's server to exit (a loading one is killed); kill it after `grace` s."""
    proc = inst.proc
    if proc is None or proc.returncode is not None:
        return
    inst.stopping = True
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM if inst.status == "loaded" else signal.SIGKILL)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def failed(inst: Instance, exc: BaseException) -> None:
    """A load that could not start (no file, no process): the model is unloaded and failed."""
    inst.status, inst.exit_code, inst.proc = "unloaded", -1, None
    inst.failure = str(exc) or type(exc).__name__


def cost_error(exc: Exception) -> Cost:
    """The cost of a model its plan could not be made for: it cannot be loaded, and says why."""
    return Cost({}, "", fits=False, why_not=str(exc) or type(exc).__name__)


def keep(tasks: set[Any], task: asyncio.Task[Any]) -> None:
    """Hold a background task until it ends (its exception is logged, not lost)."""
    tasks.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("router: %s", t.exception())

    task.add_done_callback(done)
