"""Hostile tool definitions and garbled model output against `localfab serve` in a child process.

Tools with generated JSON schemas (small valid ones, broken ones, ones far past the grammar's
limits), odd names, every tool_choice; replies forced by a `json_schema` into JSON objects that
look like calls, nearly like calls, or not at all (the server reads them with Llama 3's
marker-less syntax, where a reply that is one JSON object is a call). The server never dies,
answers 200 or 400, streams what it answers whole, and its memory stays bounded.
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


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    template = TEMPLATE / "meta-llama-Llama-3.3-70B-Instruct.jinja"
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


# Replies the model is made to write: call objects, near-calls, and other JSON.
CALLISH = st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "nope", 1, None])},
    optional={
        "parameters": st.one_of(
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.text(max_size=4)
        ),
        "type": st.just("function"),
        "extra": st.lists(st.integers(), max_size=3),
    },
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
    if draw(st.integers(0, 2)) > 0:
        body["json_schema"] = {"const": draw(st.one_of(CALLISH, st.lists(CALLISH, max_size=2)))}
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
    reply = check(server, body)
    if reply.status_code != 200:
        return
    message = reply.json()["choices"][0]["message"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    for _, arguments in calls:
        json.loads(arguments)
    assert streamed(server, body) == (message["content"], calls)


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
