"""OpenAI's Responses API on `localfab serve` over a real socket, through the openai SDK's
Responses client unchanged: a reply whole and streamed (the same text), a forced function call
and its output, and the requests it cannot take."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.serverproc import ServerProcess, serve

pytestmark = pytest.mark.model

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two whole numbers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    with serve(model_path, "-c", "2048") as running:
        yield running


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as opened:
        yield opened


def test_a_reply_whole_and_streamed(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": "local",
        "instructions": "Be brief.",
        "input": "The sea is",
        "max_output_tokens": 24,
        "temperature": 0,
    }
    client.responses.create(**ask)  # the prompt cached: the next two decode alike
    whole = client.responses.create(**ask)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status in ("completed", "incomplete") and whole.output_text.strip()
    assert whole.usage is not None and 0 < whole.usage.output_tokens <= 24
    kinds = []
    with client.responses.stream(**ask) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert final.output_text == whole.output_text
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.status == whole.status
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds


def test_a_forced_function_call_and_its_output(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": "local",
        "input": "What is 2 plus 40?",
        "tools": [ADD],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 64,
        "temperature": 0,
    }
    whole = client.responses.create(**ask)
    (call,) = [item for item in whole.output if item.type == "function_call"]
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    deltas = []
    with client.responses.stream(**ask) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        streamed = stream.get_final_response()
    (streamed_call,) = [item for item in streamed.output if item.type == "function_call"]
    assert json.loads(streamed_call.arguments) == json.loads(call.arguments)
    assert "".join(deltas) == streamed_call.arguments
    follow = client.responses.create(
        model="local",
        input=[
            {"role": "user", "content": "What is 2 plus 40?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
        ],
        tools=[ADD],
        tool_choice="none",
        max_output_tokens=24,
        temperature=0,
    )
    assert follow.output_text.strip()


def test_what_it_cannot_take(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="keeps no responses"):
        client.responses.create(model="local", input="Hi", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="input_image part is not supported"):
        client.responses.create(
            model="local",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        )


def test_llama_servers_telemetry_in_the_stream(server: ServerProcess) -> None:
    # llama-server's own fields, on its path without /v1: progress events while the prompt is
    # read, timings on each text delta and on the completed event.
    body = {
        "input": "This is a test. " * 20,
        "max_output_tokens": 4,
        "stream": True,
        "return_progress": True,
        "timings_per_token": True,
    }
    events = []
    with httpx.stream("POST", server.url + "/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    completed = events[-1]
    assert completed["type"] == "response.completed" and completed["timings"]["predicted_n"] > 0
