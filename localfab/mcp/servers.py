"""`ToolServers`: the configured MCP servers, started on demand, called from any thread.

The official `mcp` SDK is async (anyio) and each connection's `async with` must be entered and
left by one task. So the servers live on one event loop in a thread of their own: each running
server is one long-lived task that holds its connection open until it is told to stop, and a
call from a front end (a Textual worker, the CLI) is a coroutine sent to that loop and waited
on. Cancelling a call cancels its coroutine; the SDK then tells the server
(`notifications/cancelled`). `close()` stops every server and waits for their processes to end
(the SDK starts each in a process group of its own and ends the whole group): nothing outlives
the app.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

from localfab.errors import LocalfabError, UsageError
from localfab.mcp.config import DEFAULT_START_TIMEOUT, ServerConfig
from localfab.mcp.results import MAX_RESULT_CHARS, ToolOutcome, outcome

T = TypeVar("T")
# How a tool's name reaches the model: server and tool, joined (names are unique across servers).
NAME_JOINER = "__"


class ToolServerError(LocalfabError):
    """A server could not be started or reached; the message says which and why."""


@dataclass(frozen=True)
class ToolInfo:
    """One tool of one server, as listed."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    @property
    def qualified(self) -> str:
        """The name the model calls it by: `server__tool`."""
        return f"{self.server}{NAME_JOINER}{self.name}"

    @property
    def digest(self) -> str:
        """A hash of what the model is told about the tool: an approval holds for this
        definition only, and a server that changes it is asked about again."""
        text = json.dumps([self.name, self.description, self.input_schema], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def definition(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function definition, for the chat template."""
        schema = self.input_schema or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {
                "name": self.qualified,
                "description": self.description,
                "parameters": schema,
            },
        }


@dataclass(frozen=True)
class ServerExtraInfo:
    """A server's prompt (with its arguments: (name, required)) or resource (with its uri)."""

    server: str
    kind: str  # "prompt" or "resource"
    name: str
    description: str
    uri: str = ""
    arguments: tuple[tuple[str, bool], ...] = ()


@dataclass
class ServerState:
    """A server's state: off (not started), starting, ready, failed (with `error`), stopped."""

    config: ServerConfig
    status: str = "off"
    error: str = ""
    tools: tuple[ToolInfo, ...] = ()
    extras: tuple[ServerExtraInfo, ...] = ()  # its prompts and resources
    client: Any = None
    ready: threading.Event = field(default_factory=threading.Event)
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None  # the task holding the connection
    done: threading.Event = field(default_factory=lambda: _set(threading.Event()))  # ended
    unreadable: str = ""  # why a message from the server could not be read while starting
    relisting: asyncio.Task[None] | None = None  # its tools listed again (they changed)


def split_name(qualified: str) -> tuple[str, str]:
    """`server__tool` -> (server, tool); a name without the joiner has no server ("")."""
    server, sep, tool = qualified.partition(NAME_JOINER)
    return (server, tool) if sep else ("", qualified)


class ToolServers:
    """The configured servers; every method may be called from any thread but the loop's."""

    def __init__(self, configs: tuple[ServerConfig, ...], *, log_file: Path | None = None) -> None:
        self._states = {c.name: ServerState(c) for c in configs}
        self._log_file = log_file
        self._log: TextIO | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()

    # --- the loop ------------------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                _route_sdk_log(self)
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())

    def _errlog(self) -> TextIO:
        """Where stdio servers' stderr goes: the log file when one is given (a full-screen app
        must not have it written over its screen), else this process's stderr."""
        if self._log_file is None:
            return sys.stderr
        if self._log is None:
            self._log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = self._log_file.open("a", encoding="utf-8")
        return self._log

    # --- servers -------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._states)

    def state(self, name: str) -> ServerState:
        if name not in self._states:
            known = ", ".join(self._states) or "none is configured"
            raise UsageError(f"no MCP server named {name!r} (known: {known}); see `localfab mcp`")
        return self._states[name]

    def states(self) -> list[ServerState]:
        return list(self._states.values())

    def start(self, name: str, *, timeout: float = DEFAULT_START_TIMEOUT) -> ServerState:
        """Start a server (if it is not running) and wait until its tools are listed."""
        state = self.state(name)
        if not state.config.enabled:
            raise ToolServerError(f"MCP server {name!r} is turned off in the config (enabled)")
        with self._lock:
            if state.status in ("off", "stopped", "failed"):
                state.done.wait(5)  # a connection that failed is let go of first
                state.status, state.error, state.tools = "starting", "", ()
                state.ready.clear()
                state.done.clear()
                self._submit(self._hold(state))
        if not state.ready.wait(timeout):
            self.stop(name)
            state.status = "failed"
            state.error = f"it did not start within {timeout:g} s"
        if state.status != "ready":
            raise ToolServerError(f"MCP server {name!r} could not start: {state.error}")
        return state

    def tools(self, names: list[str] | None = None) -> list[ToolInfo]:
        """The tools of the named servers (default: every enabled one), starting them."""
        out: list[ToolInfo] = []
        for name in names if names is not None else self.names():
            if names is None and not self._states[name].config.enabled:
                continue
            out.extend(self.start(name).tools)
        return out

    async def _hold(self, state: ServerState) -> None:
        """Open the server's connection, list its tools, and hold it until told to stop."""
        from localfab.mcp.connect import connect, list_all_tools, watch_tool_changes

        state.stop = asyncio.Event()
        state.task = asyncio.current_task()
        state.unreadable = ""
        try:
            async with connect(state.config, self._errlog(), self._on_message(state)) as client:
                self._take_tools(state, await list_all_tools(client))
                state.extras = await _extras(state.config.name, client)
                state.client, state.status = client, "ready"
                state.ready.set()
                changed = partial(self._tools_changed, state)
                watch = asyncio.get_running_loop().create_task(watch_tool_changes(client, changed))
                try:
                    await state.stop.wait()
                finally:
                    watch.cancel()
            if state.status != "failed":  # a crash seen by a call stays failed
                state.status = "stopped"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not state.unreadable or task is None:
                raise
            task.uncancel()
            # The server sent what cannot be read while it started: its listing would
            # never come, so the start ends at once, said in one line.
            state.status, state.error = "failed", state.unreadable
        except Exception as exc:  # noqa: BLE001 - any failure is the server's state, shown
            state.status, state.error = "failed", describe(exc)
        finally:
            state.client = None
            if state.relisting is not None:
                state.relisting.cancel()
            state.ready.set()
            state.done.set()

    @staticmethod
    def _take_tools(state: ServerState, listed: list[tuple[str, str, dict[str, Any]]]) -> None:
        only = state.config.tools
        state.tools = tuple(
            ToolInfo(state.config.name, *t) for t in listed if not only or t[0] in only
        )

    def _on_message(self, state: ServerState) -> Callable[[Any], Awaitable[None]]:
        """What the server's connection hands on: a changed tool list is listed again (an
        approval holds for a tool's definition: a changed one is asked about again); a
        message that cannot be read ends a start that would wait for it."""
        from localfab.mcp.connect import TOOLS_CHANGED

        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == TOOLS_CHANGED:
                self._tools_changed(state)
            elif isinstance(message, Exception) and state.status == "starting":
                state.unreadable = f"it sent a message that could not be read ({describe(message)})"
                if state.task is not None:
                    state.task.cancel()

        return on_message

    def _tools_changed(self, state: ServerState) -> None:
        """On the loop: the server says its tools changed; they are listed again."""
        if state.status == "ready" and state.relisting is None:
            state.relisting = asyncio.get_running_loop().create_task(self._relist(state))

    async def _relist(self, state: ServerState) -> None:
        from localfab.mcp.connect import list_all_tools

        try:
            client = state.client
            if client is not None:
                async with asyncio.timeout(state.config.timeout):
                    self._take_tools(state, await list_all_tools(client))
        except Exception as exc:  # noqa: BLE001 - its tools are then none: nothing is allowed
            state.tools, state.error = (), f"its tools could not be listed again: {describe(exc)}"
        finally:
            state.relisting = None

    def refresh(self, name: str, *, timeout: float = 10.0) -> tuple[ToolInfo, ...]:
        """A running server's tools listed again now (what a call would meet), for checking
        an approval against the definition the server gives today; () when it cannot say."""
        state = self.state(name)
        if state.status != "ready" or state.client is None:
            return ()

        async def relist() -> None:
            if state.relisting is not None:
                await asyncio.shield(state.relisting)
            else:
                state.relisting = asyncio.current_task()
                await self._relist(state)

        try:
            self._submit(relist()).result(timeout)
        except Exception:  # noqa: BLE001 - a server that cannot list its tools allows nothing
            return ()
        return state.tools

    def stop(self, name: str, *, wait: float = 5.0) -> None:
        """Stop a server (its process and children end) and wait up to `wait` seconds."""
        state = self.state(name)
        loop, task, stop = self._loop, state.task, state.stop
        if loop is None or task is None or state.done.is_set():
            return
        if state.status == "ready" and stop is not None:
            loop.call_soon_threadsafe(stop.set)  # the connection closes in its own task
        else:
            loop.call_soon_threadsafe(task.cancel)  # still starting: give up on it
        if not state.done.wait(wait):
            loop.call_soon_threadsafe(task.cancel)
            state.done.wait(wait)
        if state.status in ("ready", "starting"):
            state.status = "stopped"

    def close(self) -> None:
        """Stop every server and the loop (the app quits)."""
        for name in self.names():
            self.stop(name)
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    # --- calls ---------------------------------------------------------------------------------

    def call(
        self,
        qualified: str,
        arguments: dict[str, Any],
        *,
        cancel: threading.Event | None = None,
        timeout: float | None = None,
        max_chars: int = MAX_RESULT_CHARS,
    ) -> ToolOutcome:
        """Call `server__tool` with `arguments`; wait for its outcome (never raises for the
        tool's own failures: a crash, a timeout, a cancel or garbage are outcomes too)."""
        server, tool = split_name(qualified)
        try:
            state = self.start(server)
        except (ToolServerError, UsageError) as exc:
            return ToolOutcome(str(exc), is_error=True, kind="crashed")
        limit = state.config.timeout if timeout is None else timeout
        future = self._submit(self._call(state, tool, arguments, limit, max_chars))
        while True:
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.is_set():
                    future.cancel()
                    return ToolOutcome(
                        "The call was stopped by the user before it finished.",
                        is_error=True,
                        kind="cancelled",
                    )

    def fetch(self, extra: ServerExtraInfo, arguments: dict[str, str] | None = None) -> str:
        """A prompt's text (with `arguments`) or a resource's contents; ToolServerError when
        the server cannot give it."""
        from localfab.mcp.connect import prompt_text, resource_text

        state = self.start(extra.server)

        async def get() -> str:
            async with asyncio.timeout(state.config.timeout):
                if extra.kind == "prompt":
                    return await prompt_text(state.client, extra.name, arguments or {})
                return await resource_text(state.client, extra.uri)

        try:
            return self._submit(get()).result()
        except Exception as exc:  # noqa: BLE001 - said in one line
            why = describe(exc)
            raise ToolServerError(f"{extra.server} could not give {extra.name}: {why}") from None

    async def _call(
        self,
        state: ServerState,
        tool: str,
        arguments: dict[str, Any],
        limit: float,
        max_chars: int,
    ) -> ToolOutcome:
        from localfab.mcp.connect import call_tool

        client = state.client
        if client is None:
            return ToolOutcome(
                f"MCP server {state.config.name!r} is not running", is_error=True, kind="crashed"
            )
        try:
            async with asyncio.timeout(limit):
                content, structured, is_error = await call_tool(client, tool, arguments)
        except TimeoutError:
            return ToolOutcome(
                f"The tool {tool} did not answer within {limit:g} s and was stopped.",
                is_error=True,
                kind="timeout",
            )
        except Exception as exc:  # noqa: BLE001 - the server's fault, told to the model
            message = describe(exc)
            if "closed" in message.lower() and state.stop is not None:
                state.status, state.error = "failed", "the server exited during a call"
                state.stop.set()
                message = f"The MCP server {state.config.name!r} exited during the call."
            return ToolOutcome(message, is_error=True, kind="crashed")
        return outcome(content, structured, is_error, max_chars)


class _SdkLog(logging.Handler):
    """The SDK's log records, one line each (no traceback), into the servers' log file; none
    where there is no file (a command prints each failure in a line of its own, and the app's
    screen must not be written over)."""

    def __init__(self, servers: ToolServers) -> None:
        super().__init__(logging.WARNING)
        self.servers = servers

    def emit(self, record: logging.LogRecord) -> None:
        if self.servers._log_file is None:
            return
        try:
            line = record.getMessage().splitlines()[0] if record.getMessage() else ""
            self.servers._errlog().write(f"mcp: {record.levelname}: {line}\n")
        except Exception:  # noqa: BLE001 - a log line is never worth a failure
            self.handleError(record)


def _route_sdk_log(servers: ToolServers) -> None:
    """The `mcp` loggers' records go to `servers`' log file (the newest servers' only)."""
    sdk = logging.getLogger("mcp")
    sdk.propagate = False
    for handler in [h for h in sdk.handlers if isinstance(h, _SdkLog)]:
        sdk.removeHandler(handler)
    sdk.addHandler(_SdkLog(servers))


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


async def _extras(server: str, client: Any) -> tuple[ServerExtraInfo, ...]:
    """A server's prompts and resources, as far as it lists them (a failure lists none: tools
    are what a server is started for)."""
    from localfab.mcp.connect import list_all_prompts, list_all_resources

    out: list[ServerExtraInfo] = []
    try:
        for name, text, args in await list_all_prompts(client):
            out.append(ServerExtraInfo(server, "prompt", name, text, arguments=args))
        for uri, name, text in await list_all_resources(client):
            out.append(ServerExtraInfo(server, "resource", name, text, uri=uri))
    except Exception:  # noqa: BLE001 - optional parts of a server
        return tuple(out)
    return tuple(out)


def describe(exc: BaseException) -> str:
    """One line for an exception from a server or the SDK (groups: the first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, FileNotFoundError):
        return f"its command was not found ({exc.filename or text})"
    if type(exc).__name__ == "SchemaTooDeep":  # ours, said as it is (connect is imported late)
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
