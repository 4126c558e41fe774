"""The one place that speaks to the `mcp` SDK: open a connection, list tools, call one.

Imported lazily (inside the servers' loop), so the app starts without loading the SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TextIO

import httpx2
from mcp import Client, Implementation, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from localfab import __version__
from localfab.mcp.config import ServerConfig

# Pages of tools/list read at most (a server that pages forever cannot hang a start).
MAX_TOOL_PAGES = 50


@asynccontextmanager
async def connect(config: ServerConfig, errlog: TextIO) -> AsyncIterator[Client]:
    """A connected client for `config`; the server (a process, or a session over HTTP) ends
    when the block does."""
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
            transport = stdio_client(params, errlog=errlog)
        client = Client(
            transport,
            client_info=Implementation(name="localfab", version=__version__),
        )
        yield await stack.enter_async_context(client)


async def list_all_tools(client: Client) -> list[tuple[str, str, dict[str, Any]]]:
    """Every tool of the server as (name, description, input schema), all pages."""
    tools: list[tuple[str, str, dict[str, Any]]] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(
            (t.name, t.description or t.title or "", dict(t.input_schema or {})) for t in page.tools
        )
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


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
