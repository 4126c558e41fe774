"""Hostile tool definitions and garbled model output against `localfab serve` in a child process.

Tools with generated JSON schemas (small valid ones, broken ones, ones far past the grammar's
limits), odd names, every tool_choice; and replies pushed into garbage by `logit_bias` on the
pieces calls are made of (markers, braces, quotes, key names), so the model writes half-calls,
calls in pieces and broken JSON (Qwen2.5's `<tool_call>` syntax: the lazy grammar takes over
where a whole marker appears; Llama 3.3's marker-less one: nothing constrains the JSON). The
server never dies, answers 200 or 400, streams what it answers whole, and its memory stays
bounded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.test_grammar_fuzz import schemas
from tests.serverproc import ServerProcess, serve

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).resolve().parents[1] / "engine" / "templates"
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(
    scope="module",
    params=["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"],
)
def server(model_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    template = TEMPLATE / request.param
    with serve(model_path, "-c", "2048", "--chat-template-file", str(template)) as srv:
        yield srv


NAMES = st.one_of(
    st.sampled_from(["f", "get_weather", "a.b-c", "x" * 200, "", "with space", "ü"]),
    st.text(max_size=12),
)


@st.composite
def tools(draw: st.DrawFn) -> list[Any]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        function: dict[str, Any] = {"name": draw(NAMES)}
        if draw(st.booleans()):
            function["parameters"] = draw(st.one_of(schemas(), st.just("nope"), st.just([])))
        if draw(st.integers(0, 4)) == 0:
            function["description"] = "d" * draw(st.integers(0, 20000))
        out.append(
            {"type": draw(st.sampled_from(["function", "function", "x"])), "function": function}
        )
    return out


# What calls are made of: the model is pushed towards these pieces, in any order.
PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"',
        '"name"',
        '"arguments"',
        '"parameters"',
        ":",
        ",",
        "f",
        "get_weather",
        "[",
        "]",
        "\n",
        "true",
        "1",
        "<",
        "tool",
    ]
)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": draw(tools()),
        "max_tokens": 40,
        "temperature": 0,
    }
    choice = draw(
        st.sampled_from(
            [
                None,
                "auto",
                "none",
                "required",
                "bogus",
                {"type": "function", "function": {"name": "f"}},
            ]
        )
    )
    if choice is not None:
        body["tool_choice"] = choice
    if draw(st.booleans()):
        body["parallel_tool_calls"] = draw(st.sampled_from([True, False, "yes"]))
    if draw(st.integers(0, 3)) > 0:
        body["logit_bias"] = draw(st.dictionaries(PIECES, st.floats(2, 30), min_size=1, max_size=6))
    return body


def check(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    reply = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body), timeout=300)
    assert server.alive(), f"the server died on {json.dumps(body)[:500]}: {server.stop()[-2000:]}"
    assert reply.status_code in (200, 400), (reply.status_code, reply.text[:500])
    return reply


def streamed(server: ServerProcess, body: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    content, calls = "", []
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                content += delta.get("content") or ""
                for piece in delta.get("tool_calls") or ():
                    if piece["index"] == len(calls):
                        calls.append(["", ""])
                    calls[piece["index"]][0] += piece["function"].get("name", "")
                    calls[piece["index"]][1] += piece["function"].get("arguments", "")
    return content, [(n, a) for n, a in calls]


@FUZZ
@given(body=requests())
def test_hostile_tools_and_garbled_calls(server: ServerProcess, body: dict[str, Any]) -> None:
    """200 or 400; a whole answer's calls name a given tool and carry JSON arguments (a call
    the model garbled is text); the stream is well formed and its calls name given tools. (A
    stream may show a call that broke after its name came, which the whole answer leaves out:
    the stream cannot take back what it sent; a second run may also write other text, as a
    prompt found in the cache is not computed in the same order.)"""
    reply = check(server, body)
    if reply.status_code != 200:
        return
    names = {t["function"].get("name") for t in body["tools"]}
    message = reply.json()["choices"][0]["message"]
    for call in message.get("tool_calls", []):
        assert call["function"]["name"] in names
        json.loads(call["function"]["arguments"])
    _, calls = streamed(server, body)
    assert all(name in names for name, _ in calls)


def test_memory_stays_bounded(server: ServerProcess) -> None:
    """After the fuzzing above, a hundred large tool requests more do not grow the server."""
    big = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d" * 50000,
            "parameters": {
                "type": "object",
                "properties": {f"p{i}": {"type": "string"} for i in range(200)},
            },
        },
    }
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [big], "max_tokens": 2}
    check(server, body)
    before = server.rss()
    for _ in range(100):
        check(server, body)
    assert server.rss() - before < 64 * 2**20
