"""The one place that speaks to the `mcp` SDK: open a connection, list tools, call one.

Imported lazily (inside the servers' loop), so the app starts without loading the SDK.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any, TextIO, cast

import httpx2
import psutil
from mcp import Client, Implementation, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from localfab import __version__
from localfab.engine.grammar.bounds import SCHEMA_MAX_DEPTH
from localfab.mcp.config import ServerConfig

# Pages of tools/list read at most (a server that pages forever cannot hang a start).
MAX_TOOL_PAGES = 50
# An environment variable each stdio server is started with, its value unique to the start:
# it tells which child process is that server's (the leader of its process group).
RUN_MARK = "LOCALFAB_MCP_RUN"
# Seconds what is left of a server's process group has to end after SIGTERM, before SIGKILL.
GROUP_GRACE_S = 2.0


class SchemaTooDeep(ValueError):
    """A tool's input schema is nested deeper than a tool's schema may be."""


@asynccontextmanager
async def connect(
    config: ServerConfig,
    errlog: TextIO,
    on_message: Callable[[Any], Awaitable[None]] | None = None,
) -> AsyncIterator[Client]:
    """A connected client for `config`; the server (a process, or a session over HTTP) ends
    when the block does. `on_message` gets the server's notifications and the transport's
    failures (a message that could not be read)."""
    async with AsyncExitStack() as stack:
        if config.url:
            http = httpx2.AsyncClient(
                headers=config.expanded_headers(),
                timeout=httpx2.Timeout(30.0, read=300.0),
            )
            await stack.enter_async_context(http)
            transport: Any = streamable_http_client(config.url, http_client=http)
        else:
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=config.expanded_env(),
                cwd=config.cwd or None,
            )
            transport = _stdio_group(params, errlog)
        client = Client(
            transport,
            client_info=Implementation(name="localfab", version=__version__),
            message_handler=cast(Any, on_message),
            # A listing is always the server's of now: an approval is checked against it.
            cache=None,
        )
        yield await stack.enter_async_context(client)


@asynccontextmanager
async def _stdio_group(params: StdioServerParameters, errlog: TextIO) -> AsyncIterator[Any]:
    """The SDK's stdio transport, and then the server's whole process group ended.

    The SDK starts the server as the leader of a new session and, when it closes, kills the
    group only if the leader is still running: a server that has exited (crashed, or quit on
    its own) leaves its children running. So the group is found when the server starts and
    ended after the SDK is done, whether its leader lives or not.
    """
    mark = secrets.token_hex(8)
    params = params.model_copy(update={"env": {**(params.env or {}), RUN_MARK: mark}})
    group: int | None = None
    try:
        async with stdio_client(params, errlog=errlog) as streams:
            group = _leader(mark)
            watch = None if group is None else asyncio.create_task(_end_after_leader(group))
            try:
                yield streams
            finally:
                if watch is not None:
                    watch.cancel()
    finally:
        if group is not None:
            await _end_group(group)


def _leader(mark: str) -> int | None:
    """The pid of this process's child started with `mark` (None: it has exited already)."""
    for child in psutil.Process().children():
        with suppress(psutil.Error):
            if child.environ().get(RUN_MARK) == mark:
                return int(child.pid)
    return None


async def _end_after_leader(group: int) -> None:
    """Once the server (the group's leader) has exited, the rest of its group is ended: a
    child left holding the server's stdout would keep the connection looking alive, and
    every call waiting until its timeout."""
    # No event tells of the leader's end but its pipes' closing, which a child may prevent.
    while _running(group):  # noqa: ASYNC110
        await asyncio.sleep(0.25)
    await _end_group(group)


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


async def _end_group(group: int) -> None:
    """SIGTERM to what is left of process group `group`, SIGKILL after `GROUP_GRACE_S`.
    Shielded: a stop that cancels the server's task still ends its children."""
    if sys.platform == "win32":  # no process groups (the SDK's job object ends the tree)
        return

    def signal_group(sig: int) -> bool:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return False  # every member has ended
        except PermissionError:
            return True  # a member not ours to signal, or one not yet reaped
        return True

    async def wait_and_kill() -> None:
        if not signal_group(signal.SIGTERM):
            return
        deadline = asyncio.get_running_loop().time() + GROUP_GRACE_S
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
            if not signal_group(0):
                return
        signal_group(signal.SIGKILL)

    try:
        await asyncio.shield(wait_and_kill())
    except asyncio.CancelledError:
        signal_group(signal.SIGKILL)  # no time left to wait for them
        raise


TOOLS_CHANGED = "notifications/tools/list_changed"


async def watch_tool_changes(client: Client, changed: Callable[[], None]) -> None:
    """Call `changed()` whenever the server says its tools changed, for as long as the
    connection lasts. Servers of the 2026 protocol tell only a `subscriptions/listen` stream;
    older ones send the notification to every client (it reaches `connect`'s `on_message`,
    which is where this returns at once for them)."""
    try:
        async with client.listen(tools_list_changed=True) as events:
            async for _ in events:
                changed()
    except Exception:  # noqa: BLE001 - no stream (an older server, one that refuses it)
        return


async def list_all_tools(client: Client) -> list[tuple[str, str, dict[str, Any]]]:
    """Every tool of the server as (name, description, input schema), all pages; a schema
    nested deeper than a grammar takes is `SchemaTooDeep` (what walks schemas, here and in
    the chat, never meets one)."""
    tools: list[tuple[str, str, dict[str, Any]]] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        for t in page.tools:
            schema = dict(t.input_schema or {})
            if nesting(schema) > SCHEMA_MAX_DEPTH:
                raise SchemaTooDeep(
                    f"its tool {t.name[:64]!r} has an input schema nested more than "
                    f"{SCHEMA_MAX_DEPTH} deep"
                )
            tools.append((t.name, t.description or t.title or "", schema))
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def nesting(value: Any) -> int:
    """How deep objects and arrays nest in `value` (walked without recursion: a value from a
    server may nest thousands deep)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > SCHEMA_MAX_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


async def call_tool(
    client: Client, tool: str, arguments: dict[str, Any]
) -> tuple[list[Any], dict[str, Any] | None, bool]:
    """Call `tool`; returns its content blocks, structured content and whether it failed."""
    result = await client.call_tool(tool, arguments)
    return list(result.content), result.structured_content, bool(result.is_error)


async def list_all_prompts(client: Client) -> list[tuple[str, str, tuple[tuple[str, bool], ...]]]:
    """The server's prompts as (name, description, ((argument, required), ...)); none where the
    server has no prompts."""
    if client.server_capabilities.prompts is None:
        return []
    out = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_prompts(cursor=cursor)
        for p in page.prompts:
            args = tuple((a.name, bool(a.required)) for a in p.arguments or ())
            out.append((p.name, p.description or p.title or "", args))
        cursor = page.next_cursor
        if not cursor:
            break
    return out


async def list_all_resources(client: Client) -> list[tuple[str, str, str]]:
    """The server's resources as (uri, name, description); none where it has none."""
    if client.server_capabilities.resources is None:
        return []
    out = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_resources(cursor=cursor)
        out += [(str(r.uri), r.name, r.description or r.title or "") for r in page.resources]
        cursor = page.next_cursor
        if not cursor:
            break
    return out


async def prompt_text(client: Client, name: str, arguments: dict[str, str]) -> str:
    """A prompt's messages as one text (each message's text; other content as a stand-in)."""
    from localfab.mcp.results import result_text

    result = await client.get_prompt(name, arguments)
    return "\n\n".join(result_text([m.content], None) for m in result.messages)


async def resource_text(client: Client, uri: str) -> str:
    """A resource's contents as text (a binary one as a stand-in)."""
    from localfab.mcp.results import result_text

    result = await client.read_resource(uri)
    blocks = [
        {"type": "resource", "resource": c.model_dump(by_alias=True)} for c in result.contents
    ]
    return result_text(blocks, None)
