"""Real servers for the remote tests: `localfab serve` and llama.cpp's own llama-server (built
by scripts/llama_server.sh, which scripts/test runs), on the test model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("localfab", "llama-server")


def llama_server_binary() -> Path:
    given = os.environ.get("LOCALFAB_LLAMA_SERVER")
    path = Path(given) if given else ROOT / ".cache/llama.cpp/build/bin/llama-server"
    if not path.is_file():
        pytest.fail(f"llama-server is not built at {path}: run scripts/llama_server.sh")
    return path


def start(kind: str, model: Path, *args: str) -> ServerProcess:
    """A server of `kind` on `model` with a 2048-token window and one slot, once healthy."""
    program = llama_server_binary() if kind == "llama-server" else None
    extra = ("--no-webui", "-t", "2") if program is not None else ()
    server = ServerProcess(model, "-c", "2048", "-np", "1", *extra, *args, program=program)
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()
        raise


@pytest.fixture(scope="module", params=SERVERS)
def model_server(request: pytest.FixtureRequest, model_path: Path) -> Iterator[ServerProcess]:
    server = start(request.param, model_path)
    yield server
    server.stop()
