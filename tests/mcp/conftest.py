"""Real MCP servers for the tests: `tests.mcp.toolserver` over stdio, and over streamable HTTP
on 127.0.0.1 (a child process the fixture starts and ends)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localfab.mcp.config import ServerConfig
from localfab.mcp.servers import ToolServers
from tests.serverproc import free_port

ROOT = Path(__file__).resolve().parents[2]


def stdio_config(name: str = "box", *, log: Path | None = None, **extra: object) -> ServerConfig:
    env = (("TOOLSERVER_LOG", str(log)),) if log else ()
    return ServerConfig(
        name=name,
        command=sys.executable,
        args=("-m", "tests.mcp.toolserver", "stdio"),
        cwd=str(ROOT),
        env=env,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


@pytest.fixture
def stdio_servers(tmp_path: Path, call_log: Path) -> Iterator[ToolServers]:
    servers = ToolServers((stdio_config(log=call_log),), log_file=tmp_path / "mcp.log")
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp.toolserver", "http", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # a busy machine: it is not left behind either way
        proc.kill()
        proc.wait(timeout=10)
