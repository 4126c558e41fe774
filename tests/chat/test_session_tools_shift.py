"""Context shift in a chat with tool calls (the fake engine): whole turns leave the window, a
call never without its result."""

from __future__ import annotations

import json

from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession, Reply, Shifted
from localfab.chat.tools import parse_tools
from localfab.engine.types import GenerationOptions
from tests.fake_engine import FakeEngine

ADD = {
    "type": "function",
    "function": {
        "name": "box__add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
CALL = '<tool_call>\n{"name": "box__add", "arguments": {"a": 1}}\n</tool_call>'


def test_turns_with_tool_exchanges_leave_whole() -> None:
    engine = FakeEngine(delay=0.0, n_ctx=1024)

    def reply(user: str) -> str:
        after_result = "<|im_start|>tool" in engine.last_prompt.rsplit("<|im_start|>user", 1)[-1]
        return "Done: " + "word " * 30 if after_result else f"Checking.\n{CALL}"

    engine.reply = reply
    session = ChatSession(engine, PromptBuilder(engine), system="Be brief.")
    session.set_tools(parse_tools([ADD], "auto"))
    shifted = 0
    for turn in range(12):
        events = list(
            session.send(f"turn {turn}: add one " + json.dumps(turn), GenerationOptions())
        )
        (reply_event,) = [e for e in events if isinstance(e, Reply)]
        shifted += sum(isinstance(e, Shifted) for e in events)
        session.add_tool_result(reply_event.tool_calls[0], "1")
        events = list(session.follow_up(GenerationOptions()))
        shifted += sum(isinstance(e, Shifted) for e in events)
        window = session.window()[1:]  # after the system prompt
        assert window[0]["role"] == "user"  # a turn begins the window: never a result
        for i, m in enumerate(window):
            if m["role"] == "tool":  # each result follows its call
                assert window[i - 1].get("tool_calls")
    assert shifted >= 1
