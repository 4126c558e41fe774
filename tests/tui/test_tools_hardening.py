"""Tools in the chat app against hostile or changing MCP servers (a real server over stdio):
thousands of tools are refused at once (2,000 here: the SDK lists 5,000 slowly on a busy
machine; the refusal costs the same few tokenizations), a changed tool is asked about again,
and Esc during a call ends the turn."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.mcp.approvals import Approvals
from localfab.mcp.servers import ToolServers
from localfab.tui.app import LocalfabApp
from localfab.tui.local_backend import LocalBackend
from localfab.tui.widgets.tool_cards import ToolCallCard, ToolResultCard, ToolsScreen
from tests.fake_engine import FakeEngine
from tests.mcp.conftest import stdio_config
from tests.tui.test_tools import (  # noqa: F401 - call_log: a fixture
    call_log,
    cards,
    decided_and_answered,
    run,
    tool_app,
    tools_on,
)
from tests.tui_support import build_app, finished, loaded, send, wait_for

pytestmark = pytest.mark.slow


def notes(app: LocalfabApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


class CountingEngine(FakeEngine):
    """The fake engine, counting its tokenizations (each would be a request to a remote)."""

    tokenized = 0

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        self.tokenized += 1
        return super().tokenize(text, add_special=add_special, parse_special=parse_special)


def test_thousands_of_tools_are_refused_at_once_and_the_chat_goes_on(
    tmp_path: Path,
    call_log: Path,  # noqa: F811
) -> None:
    engine = CountingEngine(delay=0.0)
    app, _ = build_app(History(tmp_path / "h.sqlite3"), engine=engine)
    backend = app.backend
    assert isinstance(backend, LocalBackend)
    config = stdio_config(log=call_log)
    config = replace(config, env=(*config.env, ("TOOLSERVER_MANY", "2000")))
    backend.servers = ToolServers((config,), log_file=tmp_path / "mcp.log")

    async def body(pilot: Pilot[None]) -> None:
        await loaded(pilot, app)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen))
        await pilot.press("enter")
        before = engine.tokenized
        await pilot.click("#tools-use")
        await wait_for(
            pilot, lambda: any("2,008 tools of box" in n for n in notes(app)), seconds=120
        )
        refusal = next(n for n in notes(app) if "2,008 tools of box" in n)
        assert "more than the 3,072 the window of 4,096 has" in refusal
        assert "tools = [...] under [mcp.servers.box]" in refusal
        assert engine.tokenized - before <= 3
        assert not any(r.in_use for r in backend.tool_servers())
        # The chat goes on without them, promptly, and a reply can be stopped.
        started, before = time.monotonic(), engine.tokenized
        await send(pilot, app, "hello")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 1, seconds=20)
        await finished(pilot, app)
        assert time.monotonic() - started < 10
        assert engine.tokenized - before < 50
        assert "many0" not in engine.last_prompt

    try:
        run(app, body)
    finally:
        backend.close()


def test_a_changed_tool_is_asked_about_again(tmp_path: Path, call_log: Path) -> None:  # noqa: F811
    """An "always" holds for a tool's definition: once the server redefines `add` (here
    without telling the client), its next call asks again."""
    app, backend = tool_app(tmp_path, call_log)
    config = stdio_config(log=call_log)
    config = replace(config, env=(*config.env, ("TOOLSERVER_REDEFINE", "1")))
    backend.servers = ToolServers((config,), log_file=tmp_path / "mcp.log")

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call add")
        await decided_and_answered(pilot, app, "a")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2)
        await finished(pilot, app)
        assert backend.servers is not None
        # Redefined without telling the client: only listing the tools again shows it.
        backend.servers.call("box__redefine", {"notify": False})
        await send(pilot, app, "again call add")
        await wait_for(pilot, lambda: len(cards(app, ToolCallCard)) == 2)
        await finished(pilot, app)
        await pilot.pause(1.0)  # the approval is checked in a worker
        second = cards(app, ToolCallCard)[-1]
        assert second.choice is None  # asked, not run

    try:
        run(app, body)
    finally:
        backend.close()
    assert call_log.read_text().count("add 2 40") == 1
    allowed = Approvals(tmp_path / "mcp-approvals.json")
    assert allowed.entries() == ["box__add"]


def test_escape_during_a_call_ends_the_turn(tmp_path: Path, call_log: Path) -> None:  # noqa: F811
    app, backend = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call slow")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: call_log.exists() and "slow 30" in call_log.read_text())
        app.chat.query_one("#prompt").focus()
        await pilot.press("escape")
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)), seconds=10)
        assert cards(app, ToolResultCard)[0].result.kind == "cancelled"
        await wait_for(pilot, lambda: any("turn ends here" in n for n in notes(app)))
        await pilot.pause(1.0)
        assert app.chat.replies_finished == 1  # the model was not asked again
        assert not app.chat.streaming
        # The chat goes on with the next message.
        await send(pilot, app, "then call add")
        await wait_for(pilot, lambda: len(cards(app, ToolCallCard)) == 2)

    try:
        run(app, body)
    finally:
        backend.close()
    assert "slow done" not in call_log.read_text()
