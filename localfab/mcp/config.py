"""MCP servers as the user configures them: `[mcp.servers.NAME]` tables of config.toml, and the
`mcpServers` JSON that Claude Desktop, LM Studio and Cursor write (VS Code's `servers` too).

A server is a command to start (stdio: `command`, `args`, `env`, `cwd`) or a URL (streamable
HTTP: `url`, `headers`). Values may name environment variables as those apps allow, `${VAR}`,
`${VAR:-default}` and `${env:VAR}`; they are expanded when the server starts, never when the
config is read or imported, so a token written as `${GITHUB_TOKEN}` stays out of every file
localfab writes. A server's process gets only the environment the SDK deems safe (PATH, HOME,
...) and its own `env`, never the whole of localfab's.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localfab.config import Config, Paths
from localfab.errors import UsageError

# Seconds a tool call may run before it is stopped, when the server's config does not say.
DEFAULT_CALL_TIMEOUT = 60.0
# Seconds a server may take to start and list its tools.
DEFAULT_START_TIMEOUT = 30.0

# The largest mcpServers JSON file read, and the most servers one may hold: such files are written
# by hand or by an app, a few kB with a handful of servers; a bigger one is not such a file.
MAX_FILE_BYTES = 1 << 20
MAX_SERVERS = 256

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_VAR = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers"}
_COMMON_KEYS = {"enabled", "timeout", "type", "description", "tools"}


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: a command (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    cwd: str = ""
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    enabled: bool = True  # false: listed, never started
    timeout: float = DEFAULT_CALL_TIMEOUT  # seconds a call may run
    tools: tuple[str, ...] = ()  # only these of its tools are offered (empty: all)

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    @property
    def target(self) -> str:
        """What the server is, for a listing: its command line or URL (no env, no headers)."""
        if self.url:
            return self.url
        return " ".join([self.command, *self.args])

    def expanded_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's own environment variables, with `${VAR}` expanded."""
        return {k: expand(v, environ) for k, v in self.env}

    def expanded_headers(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        return {k: expand(v, environ) for k, v in self.headers}


def expand(value: str, environ: Mapping[str, str] | None = None) -> str:
    """`value` with `${VAR}`, `${VAR:-default}` and `${env:VAR}` replaced from the environment.

    A variable that is not set and has no default is a `UsageError` naming it: a server started
    with an empty token fails later with a less helpful message.
    """
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise UsageError(
            f"the environment variable {name} is not set: set it, or give a default "
            f"as ${{{name}:-VALUE}}"
        )

    return _VAR.sub(one, value)


def parse_servers(raw: Any, *, where: str) -> tuple[ServerConfig, ...]:
    """Servers from a mapping of name -> settings (`[mcp.servers]`, `mcpServers`, `servers`)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: MCP servers must be a table of NAME -> settings, not {raw!r}")
    return tuple(parse_server(name, settings, where=where) for name, settings in raw.items())


def parse_server(name: str, raw: Any, *, where: str) -> ServerConfig:
    """One server's settings, checked; `UsageError` says which key is wrong and why."""
    here = f"{where}: MCP server {name!r}"
    if not _NAME.match(name) or "__" in name:
        raise UsageError(
            f"{here}: a name is 1 to 48 letters, digits, '-' or '_' (not two '_' in a row: "
            "the model calls a tool SERVER__TOOL)"
        )
    if not isinstance(raw, dict):
        raise UsageError(f"{here} must be a table with `command` or `url`")
    unknown = sorted(set(raw) - _STDIO_KEYS - _HTTP_KEYS - _COMMON_KEYS)
    if unknown:
        raise UsageError(f"{here}: unknown key(s) {', '.join(unknown)}")
    kind = raw.get("type")  # VS Code: stdio, http, sse
    if kind not in (None, "stdio", "http", "streamable-http", "streamableHttp"):
        raise UsageError(f"{here}: type {kind!r} is not supported (stdio or http; not sse)")
    has_command, has_url = "command" in raw, "url" in raw
    if has_command == has_url:
        raise UsageError(f"{here} needs either `command` (a program to start) or `url`")
    if has_url and not str(raw["url"]).startswith(("http://", "https://", "${")):
        raise UsageError(f"{here}: url must start with http:// or https://")
    return ServerConfig(
        name=name,
        command=_text(raw, "command", here),
        args=tuple(_text_list(raw, "args", here)),
        env=_pairs(raw, "env", here),
        cwd=_text(raw, "cwd", here),
        url=_text(raw, "url", here),
        headers=_pairs(raw, "headers", here),
        enabled=_flag(raw, "enabled", here),
        timeout=_timeout(raw, here),
        tools=tuple(_text_list(raw, "tools", here)),
    )


def _text(raw: dict[str, Any], key: str, here: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise UsageError(f"{here}: {key} must be a string")
    return value


def _text_list(raw: dict[str, Any], key: str, here: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{here}: {key} must be a list of strings")
    return value


def _pairs(raw: dict[str, Any], key: str, here: str) -> tuple[tuple[str, str], ...]:
    value = raw.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise UsageError(f"{here}: {key} must be a table of names to strings")
    return tuple((str(k), v) for k, v in value.items())


def _flag(raw: dict[str, Any], key: str, here: str) -> bool:
    value = raw.get(key, True)
    if not isinstance(value, bool):
        raise UsageError(f"{here}: {key} must be true or false")
    return value


def _timeout(raw: dict[str, Any], here: str) -> float:
    value = raw.get("timeout", DEFAULT_CALL_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise UsageError(f"{here}: timeout is seconds, more than 0 and at most 3600")
    return float(value)


def read_mcp_json(path: Path) -> tuple[ServerConfig, ...]:
    """Servers from a JSON file as Claude Desktop, LM Studio, Cursor (`mcpServers`) or VS Code
    (`servers`) write it (a name given twice: the last, as JSON readers take it)."""
    return read_mcp_file(path)[0]


def read_mcp_file(path: Path) -> tuple[tuple[ServerConfig, ...], list[str]]:
    """`read_mcp_json`'s servers, and the names the file gives more than once (JSON keeps the
    last of each, silently: an import says so)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path} is not a readable JSON file ({exc})") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(
            f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB: not an mcpServers file "
            "(those are a few kB)"
        )
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_Table.of)
    except RecursionError:
        raise UsageError(f"{path} is not a readable JSON file (it is nested too deep)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path} is not a readable JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object with mcpServers")
    servers = data.get("mcpServers", data.get("servers"))
    if servers is None:
        raise UsageError(f"{path}: no `mcpServers` (or VS Code's `servers`) object in it")
    if isinstance(servers, dict) and len(servers) > MAX_SERVERS:
        raise UsageError(
            f"{path} names {len(servers):,} MCP servers, more than {MAX_SERVERS}: split it, "
            "or keep the servers you use"
        )
    twice = list(servers.twice) if isinstance(servers, _Table) else []
    return parse_servers(dict(servers), where=str(path)), twice


class _Table(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once."""

    twice: list[str]

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> _Table:
        table = cls()
        table.twice = []
        for key, value in pairs:
            if key in table and key not in table.twice:
                table.twice.append(key)
            table[key] = value
        return table


def servers_from_config(table: Mapping[str, Any], *, where: str) -> tuple[ServerConfig, ...]:
    """The servers of config.toml's `[mcp]` table: `[mcp.servers.NAME]` tables, then those of
    each JSON file in `mcp.files` (a name given in both: config.toml's wins)."""
    unknown = sorted(set(table) - {"servers", "files"})
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) in [mcp]: {', '.join(unknown)}; known: servers, files"
        )
    servers = list(parse_servers(table.get("servers", {}), where=where))
    files = table.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise UsageError(f"{where}: mcp.files must be a list of paths to mcpServers JSON files")
    names = {s.name for s in servers}
    for file in files:
        for server in read_mcp_json(Path(os.path.expanduser(file))):
            if server.name not in names:
                servers.append(server)
                names.add(server.name)
    return tuple(servers)


def configured_servers(config: Config, paths: Paths) -> tuple[ServerConfig, ...]:
    """The servers config.toml names (its [mcp] table and the JSON files that table names)."""
    return servers_from_config(dict(config.mcp), where=str(paths.config_file))


def toml_string(value: str) -> str:
    """`value` as a TOML basic string; control and format characters (C0, DEL, C1, bidi
    overrides) escaped, so config.toml holds nothing a terminal acts on when it is shown."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(_toml_char(c) for c in out)
    return f'"{out}"'


def _toml_char(c: str) -> str:
    if " " <= c < "\x7f":
        return c
    kind = unicodedata.category(c)
    if kind == "Cs":  # a lone surrogate (JSON allows "\\ud800"): no TOML file can hold one
        raise UsageError(f"a value holds a lone surrogate (U+{ord(c):04X}): fix the file")
    if kind in ("Cc", "Cf"):
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
    return c


def import_notes(servers: tuple[ServerConfig, ...]) -> list[str]:
    """One line per server whose env or headers read environment variables: which ones, and
    who gets their values (an http server's host, a stdio server's command)."""
    lines = []
    for server in servers:
        names = [
            match.group(1)
            for _, value in (server.headers if server.url else server.env)
            for match in _VAR.finditer(value)
        ]
        if not names:
            continue
        named = ", ".join(dict.fromkeys(names))
        if server.url:
            whom = f"will be sent to {_host(server.url)}"
        else:
            whom = f"will be given to the program {server.command}"
        lines.append(f"{server.name}: {named} {whom}")
    return lines


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    return host or url


def server_toml(server: ServerConfig) -> str:
    """`server` as a `[mcp.servers.NAME]` table of config.toml."""
    lines = [f"[mcp.servers.{server.name}]"]
    if server.url:
        lines.append(f"url = {toml_string(server.url)}")
    else:
        lines.append(f"command = {toml_string(server.command)}")
        if server.args:
            lines.append(f"args = [{', '.join(toml_string(a) for a in server.args)}]")
        if server.cwd:
            lines.append(f"cwd = {toml_string(server.cwd)}")
    for key, pairs in (("env", server.env), ("headers", server.headers)):
        if pairs:
            items = ", ".join(f"{toml_string(k)} = {toml_string(v)}" for k, v in pairs)
            lines.append(f"{key} = {{ {items} }}")
    if not server.enabled:
        lines.append("enabled = false")
    if server.tools:
        lines.append(f"tools = [{', '.join(toml_string(t) for t in server.tools)}]")
    if server.timeout != DEFAULT_CALL_TIMEOUT:
        lines.append(f"timeout = {server.timeout:g}")
    return "\n".join(lines) + "\n"
