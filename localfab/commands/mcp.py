"""`localfab mcp`: the MCP tool servers the chat app can use: list them, start one and list its
tools, call a tool by hand, import Claude Desktop's / LM Studio's / Cursor's `mcpServers` JSON
into config.toml, and take back an "always allow"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from localfab.errors import UsageError
from localfab.textsafe import visible_controls


def _context() -> tuple[Any, Any]:
    from localfab.config import Config, default_paths

    paths = default_paths()
    return Config.load(paths), paths


def _servers() -> Any:
    from localfab.mcp.config import configured_servers
    from localfab.mcp.servers import ToolServers

    config, paths = _context()
    return ToolServers(configured_servers(config, paths))


@click.group("mcp", invoke_without_command=True)
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """The MCP tool servers for the chat app: list, tools, call, import, revoke."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_servers)


@mcp.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the servers as JSON.")
def list_servers(as_json: bool) -> None:
    """The configured servers: name, transport, command or URL (never env or headers)."""
    from localfab.mcp.config import configured_servers

    config, paths = _context()
    servers = configured_servers(config, paths)
    if as_json:
        rows = [
            {"name": s.name, "transport": s.transport, "target": s.target, "enabled": s.enabled}
            for s in servers
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    if not servers:
        click.echo(
            f"No MCP servers configured. Add [mcp.servers.NAME] tables to {paths.config_file},\n"
            "or import an mcpServers JSON file: localfab mcp import FILE"
        )
        return
    for s in servers:
        state = "" if s.enabled else "  (turned off)"
        click.echo(visible_controls(f"{s.name:16} {s.transport:5} {s.target}{state}"))


@mcp.command("tools")
@click.argument("name", required=False)
def tools(name: str | None) -> None:
    """Start the servers (or server NAME) and list their tools."""
    from localfab.mcp.servers import ToolServerError

    servers = _servers()
    failed = 0
    try:
        for server in [name] if name else servers.names():
            try:
                listed = servers.tools([server])
            except ToolServerError as exc:
                click.echo(f"{server}: {exc}", err=True)
                failed += 1
                continue
            click.echo(f"{server}: {len(listed)} tool(s)")
            for tool in listed:
                summary = (tool.description.strip().splitlines() or [""])[0]
                click.echo(visible_controls(f"  {tool.qualified:32} {summary[:80]}"))
    finally:
        servers.close()
    if failed:
        raise SystemExit(1)


@mcp.command("call")
@click.argument("tool")
@click.argument("arguments", default="{}")
@click.option("--timeout", type=float, default=None, help="Seconds the call may take.")
def call(tool: str, arguments: str, timeout: float | None) -> None:
    """Call TOOL (SERVER__TOOL) with ARGUMENTS (a JSON object) and print its result."""
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise UsageError(f"ARGUMENTS must be a JSON object: {exc}") from exc
    if not isinstance(parsed, dict):
        raise UsageError('ARGUMENTS must be a JSON object, such as \'{"path": "notes.txt"}\'')
    servers = _servers()
    try:
        outcome = servers.call(tool, parsed, timeout=timeout)
    finally:
        servers.close()
    click.echo(visible_controls(outcome.text))
    if outcome.is_error:
        raise SystemExit(1)


@mcp.command("import")
@click.argument("file", type=click.Path(path_type=Path))
def import_servers(file: Path) -> None:
    """Add the servers of FILE (Claude Desktop's, LM Studio's or Cursor's mcpServers JSON, or
    VS Code's servers) to config.toml as [mcp.servers.NAME] tables."""
    from localfab.config import append_to_config
    from localfab.mcp.config import configured_servers, import_notes, read_mcp_file, server_toml

    config, paths = _context()
    new, twice = read_mcp_file(file)
    have = {s.name for s in configured_servers(config, paths)}
    taken = sorted(s.name for s in new if s.name in have)
    # Nothing is imported from a file that is ambiguous or clashes: which server a name
    # means is the person's to say, one line for each clash.
    problems = [
        f"{file} names MCP server {name!r} more than once (JSON keeps the last): rename or "
        "remove the others"
        for name in twice
    ]
    if taken:
        problems.append(
            f"{paths.config_file} already has MCP server(s) {', '.join(taken)}: rename or "
            "remove them there first"
        )
    for line in problems:
        click.echo(visible_controls(line), err=True)
    if problems:
        raise UsageError(f"nothing imported from {file}: its server names clash (said above)")
    if not new:
        click.echo(f"{file}: no servers in it")
        return
    append_to_config(paths, "\n".join(server_toml(s) for s in new))
    click.echo(
        visible_controls(
            f"Added {len(new)} server(s) to {paths.config_file}: " + ", ".join(s.name for s in new)
        )
    )
    notes = import_notes(new)
    if notes:
        click.echo(
            "Environment variables these servers read when they start (check that you "
            "trust who gets them):"
        )
        for line in notes:
            click.echo(visible_controls(f"  {line}"))


@mcp.command("revoke")
@click.argument("name", required=False)
def revoke(name: str | None) -> None:
    """Take back "always allow" for a tool (SERVER__TOOL) or all of a server's; without NAME,
    list the always-allowed tools."""
    from localfab.mcp.approvals import FILE_NAME, Approvals

    _, paths = _context()
    approvals = Approvals(paths.config_dir / FILE_NAME)
    if name is None:
        entries = approvals.entries()
        click.echo("\n".join(entries) if entries else "No tool is always allowed.")
        return
    gone = approvals.revoke(name)
    if not gone:
        raise UsageError(f"{name} is not always allowed (see: localfab mcp revoke)")
    click.echo("No longer always allowed: " + ", ".join(gone))
