"""Which `localfab serve` servers run on this machine, and with which model, so that the chat
app can attach to one that already holds its model instead of loading it a second time.

Each server writes a small record (`<cache>/servers/<pid>.json`: its URL, model file and
whether it wants a key) once it listens, and removes it when it stops; a record whose process
is gone is stale and removed by the next reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from localfab.config import Paths
    from localfab.remote.client import Remote


@dataclass(frozen=True)
class RunningServer:
    pid: int
    url: str
    model_path: str
    model: str
    keyed: bool  # it asks for an API key


def _folder(paths: Paths) -> Path:
    return paths.cache_dir / "servers"


def record_server(paths: Paths, server: RunningServer) -> Path | None:
    """Write the record of this process's server; None when the folder cannot be written
    (attaching is a convenience: serving goes on without it)."""
    path = _folder(paths) / f"{server.pid}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(server)), encoding="utf-8")
    except OSError:
        return None
    return path


def forget_server(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> RunningServer | None:
    """A record, if it is one (anything else in the folder is ignored)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        server = RunningServer(**raw)
    except (OSError, ValueError, TypeError):
        return None
    kinds = (int, str, str, str, bool)
    values = (server.pid, server.url, server.model_path, server.model, server.keyed)
    if not all(
        isinstance(v, k) and not (k is int and isinstance(v, bool))
        for v, k in zip(values, kinds, strict=True)
    ):
        return None
    return server


def _loopback(url: str) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def running_servers(paths: Paths) -> list[RunningServer]:
    """The servers whose process still runs (stale records are removed)."""
    out = []
    for path in sorted(_folder(paths).glob("*.json")):
        server = _read(path)
        if server is None:
            continue
        if _alive(server.pid) and server.pid != os.getpid():
            out.append(server)
        elif server.pid != os.getpid():
            forget_server(path)
    return out


def server_with(paths: Paths, model_path: Path) -> RunningServer | None:
    """A running server on this machine (a loopback URL) that holds `model_path`, as its
    record says and its own /props confirms (a pid reused by another process, or a record
    written by something else, is not offered)."""
    for server in running_servers(paths):
        with contextlib.suppress(OSError):
            if not _loopback(server.url) or not Path(server.model_path).samefile(model_path):
                continue
            if _serves(server.url, model_path, keyed=server.keyed):
                return server
    return None


def _serves(url: str, model_path: Path, *, keyed: bool) -> bool:
    """Whether the server at `url` answers that it holds `model_path` (within a second)."""
    import httpx2

    key = os.environ.get("LLAMA_API_KEY", "") if keyed else ""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        props = httpx2.get(url + "/props", timeout=1.0, headers=headers).json()
        return Path(str(props.get("model_path", ""))).samefile(model_path)
    except (httpx2.HTTPError, ValueError, AttributeError, OSError):
        return False


def offer_attach(model: str | None, paths: Paths, attach: bool | None) -> Remote | None:
    """Before the app loads `model`: when a `localfab serve` on this machine already holds
    it, ask whether to chat through it (`attach`: the answer given by a flag; asked only on a
    terminal). Returns the server to attach to, or None to load the model here."""
    if model is None or attach is False:
        return None
    from localfab.errors import LocalfabError
    from localfab.remote.client import Remote
    from localfab.store import Store

    try:
        path = Store(paths).resolve(model)
    except LocalfabError:
        return None  # the app says what is wrong with the name when it loads it
    server = server_with(paths, path)
    if server is None:
        return None
    key_env = "LLAMA_API_KEY" if server.keyed and os.environ.get("LLAMA_API_KEY") else ""
    if server.keyed and not key_env:
        return None  # it wants a key this process does not have
    if attach is None:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            return None
        attach = click.confirm(
            f"localfab serve (pid {server.pid}) at {server.url} already holds {model}. "
            "Chat through it instead of loading it again (the memory is shared)?",
            default=True,
        )
    if not attach:
        return None
    return Remote(server.url, name=f"serve {server.url.split('//')[-1]}", api_key_env=key_env)
