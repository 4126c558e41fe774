"""Anthropic's Messages API on `localfab serve` over a real socket, through the Anthropic SDK
unchanged: a reply whole and streamed (the same text), a forced tool call and its result, the
token count, and a malformed request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serverproc import ServerProcess, serve

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.model

ADD = {
    "name": "add",
    "description": "Add two whole numbers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
ASK = [{"role": "user", "content": "What is 2 plus 40?"}]


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    # Greedy by default: this SDK has no temperature (a server default is the way to set it).
    with serve(model_path, "-c", "2048", "--temp", "0") as running:
        yield running


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0) as opened:
        yield opened


def test_a_reply_whole_and_streamed(client: Any) -> None:
    ask: dict[str, Any] = {
        "model": "local",
        "max_tokens": 24,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "The sea is"}],
    }
    client.messages.create(**ask)  # the prompt cached: the next two decode alike
    whole = client.messages.create(**ask)
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.id.startswith("msg_") and whole.model == "local"
    (block,) = whole.content
    assert block.type == "text" and block.text.strip()
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 24
    kinds, started = [], None
    with client.messages.stream(**ask) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "message_start":
                started = event.message.usage
        final = stream.get_final_message()
    # message_start already says the prompt's size (as llama-server's).
    assert started is not None
    assert started.input_tokens + (started.cache_read_input_tokens or 0) == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    )
    assert final.content[0].text == block.text  # greedy: the same reply
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds


def test_a_forced_tool_call_and_its_result(client: Any) -> None:
    ask: dict[str, Any] = {
        "model": "local",
        "max_tokens": 64,
        "tools": [ADD],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": ASK,
    }
    whole = client.messages.create(**ask)
    assert whole.stop_reason == "tool_use"
    (call,) = [b for b in whole.content if b.type == "tool_use"]
    assert call.name == "add" and set(call.input) == {"a", "b"}  # the schema held
    partial = []
    with client.messages.stream(**ask) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        streamed = stream.get_final_message()
    (streamed_call,) = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed_call.input == call.input and partial
    # The result goes back; the model answers it in words.
    follow = client.messages.create(
        model="local",
        max_tokens=24,
        tools=[ADD],
        messages=[
            *ASK,
            {"role": "assistant", "content": [c.model_dump() for c in whole.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}],
            },
        ],
    )
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_is_the_prompt(client: Any) -> None:
    counted = client.messages.count_tokens(model="local", system="Be brief.", messages=ASK)
    whole = client.messages.create(model="local", max_tokens=1, system="Be brief.", messages=ASK)
    read = whole.usage.cache_read_input_tokens or 0  # processed and cached ones are apart
    assert counted.input_tokens == whole.usage.input_tokens + read > 0


def test_a_malformed_request_is_a_400(client: Any) -> None:
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", body={"model": "local", "messages": ASK}, cast_to=object)
    with pytest.raises(anthropic.BadRequestError, match="image's source must be"):
        client.messages.create(
            model="local",
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )


def test_a_stop_sequence_that_ends_the_reply_is_named(client: Any) -> None:
    ask: dict[str, Any] = {
        "model": "local",
        "max_tokens": 24,
        "messages": [{"role": "user", "content": "Count from one to ten: one, two,"}],
    }
    free = client.messages.create(**ask).content[0].text
    # A piece of the greedy reply that first shows after its start.
    word = next(free[k : k + 4] for k in range(1, len(free)) if free.index(free[k : k + 4]) == k)
    stopped = client.messages.create(**ask, stop_sequences=[word, "never said"])
    assert stopped.stop_reason == "end_turn" and stopped.stop_sequence == word  # llama-server's
    assert word not in stopped.content[0].text and free.startswith(stopped.content[0].text)
    with client.messages.stream(**ask, stop_sequences=[word]) as stream:
        final = stream.get_final_message()
    assert final.stop_sequence == word and final.content[0].text == stopped.content[0].text
    unstopped = client.messages.create(**ask, stop_sequences=["never said"])
    assert unstopped.stop_sequence is None
