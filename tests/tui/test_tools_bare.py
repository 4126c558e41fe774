"""A small model's tool call without its template's markers, in the chat app: the fake model
writes the bare JSON object, one brace short, as Qwen2.5-Coder 0.5B does; the app shows it as a
call card (not as text), asks, and the real MCP server runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.mcp.approvals import Approvals
from localfab.mcp.servers import ToolServers
from localfab.tui.app import LocalfabApp
from localfab.tui.local_backend import LocalBackend
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.tool_cards import ToolCallCard, ToolResultCard
from tests.mcp.conftest import stdio_config
from tests.tui.test_tools import (
    ANSWER,
    call_log,  # noqa: F401 - a fixture
    cards,
    decided_and_answered,
    run,
    stored_roles,
    tool_engine,
    tools_on,
)
from tests.tui_support import build_app, finished, send, wait_for

pytestmark = pytest.mark.slow

BARE = {
    "bare": '{"name": "box__add", "arguments": {"a": 2, "b": 40}',
    "fenced": '```json\n{"name": "box__add", "arguments": {"a": 2, "b": 40}}\n```',
    "wrong": '{"name": "box__add", "arguments": {"a": "two", "b": 40}}',
}


def bare_app(tmp_path: Path, call_log: Path) -> LocalfabApp:  # noqa: F811
    """The app of `test_tools` whose model, asked to "call bare" (fenced, wrong), writes
    BARE's text; after a tool's result, it answers."""
    engine = tool_engine()
    script = engine.reply

    def reply(user: str) -> str:
        word = user.split()[-1]
        answered = "<|im_start|>tool" in engine.last_prompt.rsplit("<|im_start|>user", 1)[-1]
        if word in BARE and not answered:
            return BARE[word]
        return script(user)

    engine.reply = reply
    app, _ = build_app(History(tmp_path / "h.sqlite3"), engine=engine)
    backend = app.backend
    assert isinstance(backend, LocalBackend)
    backend.servers = ToolServers((stdio_config(log=call_log),), log_file=tmp_path / "mcp.log")
    backend.approvals = Approvals(tmp_path / "mcp-approvals.json")
    return app


def reply_texts(app: LocalfabApp) -> list[str]:
    return [v.text for v in app.chat.query(MessageView) if v.role == "assistant"]


@pytest.mark.parametrize("form", ["bare", "fenced"])
def test_a_bare_json_call_is_a_call_card(tmp_path: Path, call_log: Path, form: str) -> None:  # noqa: F811
    app = bare_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, f"please call {form}")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)))
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2)
        await finished(pilot, app)
        (card,) = cards(app, ToolCallCard)
        assert (card.call.name, card.call.arguments) == ("box__add", {"a": 2, "b": 40})
        assert cards(app, ToolResultCard)[0].result.text == "42"
        assert not any('"box__add"' in text for text in reply_texts(app))
        assert stored_roles(app)[1:] == [("assistant", ""), ("tool", "42"), ("assistant", ANSWER)]

    run(app, body)
    assert call_log.read_text() == "add 2 40\n"


def test_json_that_does_not_fit_the_tool_stays_text(tmp_path: Path, call_log: Path) -> None:  # noqa: F811
    app = bare_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call wrong")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 1)
        await finished(pilot, app)
        assert cards(app, ToolCallCard) == []
        assert json.loads(reply_texts(app)[-1])["arguments"]["a"] == "two"

    run(app, body)
    assert not call_log.exists()
