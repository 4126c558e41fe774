"""An agent's long loop under `--context-shift`: one user message, then tool calls and their
results, more than the window holds. Its oldest tool exchanges leave (whole: a call never
without its result), the task and the newest exchange stay."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.server.chat_window import ChatWindow
from tests.engine.test_toolcalls import WEATHER
from tests.server.test_tools import TEMPLATES
from tests.serverproc import serve


def agent_loop(n: int, result: str = "sunny") -> list[dict[str, Any]]:
    """A system prompt, one task, then `n` exchanges: a call and its tool result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather agent."},
        {"role": "user", "content": "Find a sunny city."},
    ]
    for i in range(n):
        call_id = f"call{i:05d}"
        arguments = json.dumps({"city": f"City{i}"})
        call = {"id": call_id, "type": "function", "function": {"name": "get_weather"}}
        call["function"]["arguments"] = arguments  # type: ignore[index]
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"{result} {i}"})
    return messages


def as_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """A stand-in prompt: one token per message (a call: 1000 + its number, its result ten of
    2000 + that number, other messages their place)."""
    out: list[int] = []
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            out.append(1000 + int(m["tool_calls"][0]["id"][4:]))
        elif m["role"] == "tool":
            out += [2000 + int(m["tool_call_id"][4:])] * 10
        else:
            out.append(i)
    return out


def exchanges(tokens: list[int]) -> list[int]:
    """The exchanges a stand-in prompt holds, by number."""
    return [t - 1000 for t in tokens if 1000 <= t < 2000]


def test_the_oldest_exchanges_leave_whole_and_the_task_stays() -> None:
    messages = agent_loop(20)  # 2 + 40 messages: 2 + 20 * 11 = 222 tokens
    window = ChatWindow(messages, as_tokens, 400)
    assert window.fit(100)
    assert window.tokens[:2] == [0, 1]  # the system prompt and the task
    # Whole exchanges, the newest ones, as many as fit: 2 + 8 * 11 = 90 <= 100 < 101.
    assert window.tokens[2:] == as_tokens(messages[-16:])
    assert exchanges(window.tokens) == list(range(12, 20))
    assert window.left_out == {"turns": 0, "exchanges": 12, "tokens": 222 - 90}
    assert window.shifted
    # More room needed later (the reply grows): more exchanges go, the newest stays.
    assert window.fit(30)
    assert exchanges(window.tokens) == [18, 19]
    assert window.left_out["exchanges"] == 18
    assert not window.fit(5)  # the task and the newest exchange never leave
    assert window.tokens == [0, 1, *as_tokens(messages[-2:])]
    assert window.left_out["exchanges"] == 19


def test_older_turns_leave_before_the_last_turns_exchanges() -> None:
    earlier = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi"},
    ]
    loop = agent_loop(10)
    messages = [loop[0], *earlier, *loop[1:]]
    window = ChatWindow(messages, as_tokens, 400)
    assert window.fit(2 + 10 * 11)  # without the earlier turn, all ten exchanges fit
    assert window.left_out == {"turns": 1, "exchanges": 0, "tokens": 2}
    assert exchanges(window.tokens) == list(range(10))
    assert window.fit(2 + 5 * 11)
    assert exchanges(window.tokens) == list(range(5, 10))
    assert window.left_out["exchanges"] == 5


@pytest.mark.model
def test_a_long_agent_loop_goes_on_past_the_window(model_path: Path) -> None:
    """On the real model with Qwen2.5's template: a loop of 60 exchanges (about 4,000 tokens)
    into a 1,024-token window gets a call back, its oldest exchanges left out."""
    template = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
    messages = agent_loop(60, result="sunny and warm, light wind from the west, " * 3)
    args = ("-c", "1024", "--context-shift", "--chat-template-file", str(template))
    with serve(model_path, *args) as server:
        body = {
            "messages": messages,
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": 48,
            "temperature": 0,
        }
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        res = r.json()
        assert res["context_shift"]["exchanges"] > 30, res["context_shift"]
        assert res["usage"]["prompt_tokens"] < 1024
        choice = res["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
