"""ChatSession with tools on the real test model: a call held by the grammar, its result fed
back as a `tool` message, the turn going on, and all of it stored, reopened and exported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession, Reply
from localfab.chat.tools import parse_tools
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.engine import Engine, EngineSettings, SamplingParams
from localfab.engine.types import GenerationOptions
from localfab.errors import UsageError

pytestmark = pytest.mark.model

GREEDY = GenerationOptions(sampling=SamplingParams.greedy(), max_tokens=48)
ADD = {
    "type": "function",
    "function": {
        "name": "box__add",
        "description": "Add two whole numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Engine]:
    eng = Engine(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    yield eng
    eng.close()


def _reply(events: Iterator[object]) -> Reply:
    replies = [e for e in events if isinstance(e, Reply)]
    assert len(replies) == 1
    return replies[0]


def test_forced_call_result_and_follow_up(engine: Engine, tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(engine, PromptBuilder(engine), system="Be brief.", history=history)
    session.set_tools(parse_tools([ADD], "required"))
    assert session.tool_system is not None and "box__add" in session.tool_system
    reply = _reply(session.send("What is 2 plus 40?", GREEDY))
    assert reply.finish_reason == "tool_calls" or reply.tool_calls
    (call,) = reply.tool_calls
    assert call.name == "box__add" and set(call.arguments) == {"a", "b"}  # the schema held
    assert len(call.id) == 32
    assert session.messages[-1]["tool_calls"][0]["id"] == call.id
    room = session.room_for_result()
    assert 0 < room < 2048
    session.add_tool_result(call, "42")
    # The model answers the result: tools stay offered, but it need not call again.
    session.set_tools(parse_tools([ADD], "auto"))
    follow = _reply(session.follow_up(GREEDY))
    assert follow.text or follow.tool_calls
    roles = [m["role"] for m in session.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    with pytest.raises(UsageError, match="no tool result"):
        list(session.follow_up(GREEDY))

    # Reopened: the same messages, calls and results as the template takes them.
    stored = history.messages(session.session_id or 0)
    assert [m.role for m in stored] == roles
    reopened = ChatSession.resume(history, session.session_id or 0, engine, PromptBuilder(engine))
    assert reopened.messages[1]["tool_calls"] == session.messages[1]["tool_calls"]
    assert reopened.messages[2] == {
        "role": "tool",
        "content": "42",
        "tool_call_id": call.id,
        "name": "box__add",
    }

    # Exported and imported: the calls and results come back.
    exported = export_json(history, session.session_id or 0)
    data = json.loads(exported)
    assert data["messages"][1]["tools"]["calls"][0]["name"] == "box__add"
    assert data["messages"][2]["tools"] == {
        "call_id": call.id,
        "name": "box__add",
        "kind": "result",
    }
    copy = import_json(history, exported)
    assert [m.tools for m in history.messages(copy)] == [m.tools for m in stored]
    markdown = export_markdown(history, copy)
    assert "Tool call `box__add`" in markdown and "## Tool result (box__add, result)" in markdown
    # Found by search: a tool result's text is indexed as any message's.
    session.add_tool_result(call, "the lighthouse log says: foghorn serviced")
    assert any(hit.session_id == session.session_id for hit in history.search("foghorn"))
