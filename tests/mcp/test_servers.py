"""ToolServers against real MCP servers (the SDK's MCPServer over stdio and streamable HTTP)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from localfab.mcp.config import ServerConfig
from localfab.mcp.servers import ToolInfo, ToolServerError, ToolServers, split_name
from tests.mcp.conftest import stdio_config

pytestmark = pytest.mark.slow

TOOLS = {"add", "echo", "slow", "crash", "big", "ansi", "broken", "picture"}


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def test_stdio_tools_listed_and_called(stdio_servers: ToolServers, call_log: Path) -> None:
    tools = stdio_servers.tools()
    assert {t.name for t in tools} == TOOLS
    add = next(t for t in tools if t.name == "add")
    assert add.qualified == "box__add"
    assert add.definition()["function"]["parameters"]["properties"].keys() == {"a", "b"}
    assert "Add two" in add.description
    result = stdio_servers.call("box__add", {"a": 2, "b": 40})
    assert (result.text, result.is_error, result.kind) == ("42", False, "result")
    assert call_log.read_text() == "add 2 40\n"
    assert stdio_servers.state("box").status == "ready"


def test_http_tools_listed_and_called(http_url: str) -> None:
    servers = ToolServers((ServerConfig(name="web", url=http_url),))
    try:
        assert {t.name for t in servers.tools()} == TOOLS
        assert servers.call("web__echo", {"text": "héllo"}).text == "héllo"
    finally:
        servers.close()


def test_tool_errors_are_outcomes(stdio_servers: ToolServers) -> None:
    broken = stdio_servers.call("box__broken", {})
    assert broken.is_error and broken.kind == "error" and "broken" in broken.text
    image = stdio_servers.call("box__picture", {})
    assert not image.is_error and image.text.startswith("[image/png")
    unknown = stdio_servers.call("nowhere__add", {})
    assert unknown.is_error and "no MCP server named 'nowhere'" in unknown.text


def test_timeout_stops_the_call(stdio_servers: ToolServers, call_log: Path) -> None:
    t0 = time.monotonic()
    result = stdio_servers.call("box__slow", {"seconds": 20}, timeout=1)
    assert result.kind == "timeout" and "1 s" in result.text
    assert time.monotonic() - t0 < 10
    # The server still answers the next call.
    assert stdio_servers.call("box__add", {"a": 1, "b": 1}).text == "2"


def test_cancel_stops_the_call(stdio_servers: ToolServers) -> None:
    stdio_servers.start("box")
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    t0 = time.monotonic()
    result = stdio_servers.call("box__slow", {"seconds": 20}, cancel=cancel)
    assert result.kind == "cancelled" and result.is_error
    assert time.monotonic() - t0 < 5


def test_crash_mid_call_then_restart(stdio_servers: ToolServers) -> None:
    crashed = stdio_servers.call("box__crash", {})
    assert crashed.kind == "crashed" and "exited" in crashed.text
    assert stdio_servers.state("box").status == "failed"
    # The next call starts the server again.
    assert stdio_servers.call("box__add", {"a": 3, "b": 4}).text == "7"


def test_big_result_is_cut_with_a_note(stdio_servers: ToolServers) -> None:
    result = stdio_servers.call("box__big", {"n": 1_000_000}, max_chars=4000)
    assert result.cut and result.full_chars == 1_000_000
    assert len(result.text) <= 4000
    assert "result cut: 1,000,000 characters" in result.text


def test_a_command_that_does_not_exist_fails_clearly(tmp_path: Path) -> None:
    servers = ToolServers(
        (ServerConfig(name="gone", command="/nonexistent/mcp-server"),),
        log_file=tmp_path / "log",
    )
    try:
        with pytest.raises(ToolServerError, match="could not start: its command was not found"):
            servers.start("gone")
        assert servers.state("gone").status == "failed"
    finally:
        servers.close()


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    # `sleep` reads nothing and writes nothing: no MCP handshake ever comes back.
    servers = ToolServers((ServerConfig(name="mute", command="sleep", args=("60",)),))
    try:
        with pytest.raises(ToolServerError, match="did not start within 1 s"):
            servers.start("mute", timeout=1)
    finally:
        servers.close()
    assert not [p for p in _children() if p.name() == "sleep"]


def test_garbage_on_stdout_is_a_failed_start(tmp_path: Path) -> None:
    servers = ToolServers(
        (ServerConfig(name="junk", command="sh", args=("-c", "yes garbage")),),
        log_file=tmp_path / "log",
    )
    try:
        with pytest.raises(ToolServerError, match="junk"):
            servers.start("junk", timeout=2)
    finally:
        servers.close()


def test_close_with_a_call_running_leaves_no_child(tmp_path: Path, call_log: Path) -> None:
    before = {p.pid for p in _children()}
    servers = ToolServers((stdio_config(log=call_log),), log_file=tmp_path / "log")
    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(servers.call("box__slow", {"seconds": 60}))
    )
    worker.start()
    deadline = time.monotonic() + 20
    while "slow 60" not in (call_log.read_text() if call_log.exists() else ""):
        assert time.monotonic() < deadline, "the call never reached the server"
        time.sleep(0.05)
    assert {p.pid for p in _children()} - before  # the server's process is running
    servers.close()
    worker.join(10)
    assert not worker.is_alive() and outcome
    assert not {p.pid for p in _children() if p.is_running()} - before
    assert "slow done" not in call_log.read_text()


def test_environment_is_not_passed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_OF_LOCALFAB", "hunter2")
    monkeypatch.setenv("GIVEN_TOKEN", "t0k3n")
    code = "import os,sys; sys.stderr.write(repr(sorted(os.environ.items())))"
    servers = ToolServers(
        (
            ServerConfig(
                name="env",
                command="python3",
                args=("-c", code),
                env=(("TOKEN", "${GIVEN_TOKEN}"),),
            ),
        ),
        log_file=tmp_path / "log",
    )
    try:
        with pytest.raises(ToolServerError):
            servers.start("env", timeout=10)
    finally:
        servers.close()
    seen = (tmp_path / "log").read_text()
    assert "('TOKEN', 't0k3n')" in seen
    assert "hunter2" not in seen


def test_split_name() -> None:
    assert split_name("files__read_file") == ("files", "read_file")
    assert split_name("plain") == ("", "plain")


def test_only_the_listed_tools_are_offered(tmp_path: Path) -> None:
    servers = ToolServers((stdio_config(tools=("add", "echo")),), log_file=tmp_path / "log")
    try:
        assert [t.name for t in servers.tools()] == ["add", "echo"]
    finally:
        servers.close()


def test_prompts_and_resources_are_listed_and_fetched(stdio_servers: ToolServers) -> None:
    extras = {e.name: e for e in stdio_servers.start("box").extras}
    review, today = extras["review"], extras["today"]
    assert review.kind == "prompt" and review.arguments == (("code", True),)
    assert today.kind == "resource" and today.uri == "notes://today"
    assert stdio_servers.fetch(review, {"code": "x = 1"}) == "Please review this code:\nx = 1"
    assert stdio_servers.fetch(today).endswith("buy milk")
    with pytest.raises(ToolServerError, match="could not give review"):
        stdio_servers.fetch(review, {})  # a required argument missing


def test_a_server_that_exits_leaves_no_child_behind(tmp_path: Path, call_log: Path) -> None:
    """The server starts a child and then exits (here: crashes mid-call); the SDK only ends
    the process group while its leader lives, the servers end what is left of it."""
    pid_file = tmp_path / "child.pid"
    config = stdio_config(log=call_log)
    config = replace(config, env=(*config.env, ("TOOLSERVER_CHILD", str(pid_file))))
    servers = ToolServers((config,), log_file=tmp_path / "log")
    try:
        servers.start("box")
        child = psutil.Process(int(pid_file.read_text()))
        assert child.is_running() and child.name() == "sleep"
        assert servers.call("box__crash", {}).kind == "crashed"
        assert servers.state("box").done.wait(10)  # the connection has closed
    finally:
        servers.close()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the server's child outlived it"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def changing_servers(tmp_path: Path) -> Iterator[ToolServers]:
    """The test server with its `redefine` tool."""
    config = stdio_config()
    config = replace(config, env=(*config.env, ("TOOLSERVER_REDEFINE", "1")))
    servers = ToolServers((config,), log_file=tmp_path / "mcp.log")
    yield servers
    servers.close()


def test_a_changed_tool_list_is_listed_again(changing_servers: ToolServers) -> None:
    """notifications/tools/list_changed: the servers list the tools again, so what the chat
    offers and what an approval is checked against is the definition of today."""
    stdio_servers = changing_servers
    before = {t.name: t for t in stdio_servers.tools()}["add"]
    assert stdio_servers.call("box__redefine", {}).text == "redefined"

    def add_now() -> ToolInfo:
        return {t.name: t for t in stdio_servers.state("box").tools}["add"]

    deadline = time.monotonic() + 10
    while add_now().digest == before.digest and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "evil.example" in add_now().description


def test_a_silently_changed_tool_is_seen_on_refresh(changing_servers: ToolServers) -> None:
    stdio_servers = changing_servers
    before = {t.name: t for t in stdio_servers.tools()}["add"]
    assert stdio_servers.call("box__redefine", {"notify": False}).text == "redefined"
    assert {t.name: t for t in stdio_servers.state("box").tools}["add"] == before
    after = {t.name: t for t in stdio_servers.refresh("box")}["add"]
    assert "evil.example" in after.description and after.digest != before.digest
