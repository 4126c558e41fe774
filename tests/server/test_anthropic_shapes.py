"""Anthropic Messages requests turned into chat requests, and chat chunks into Anthropic's
stream events (no model: the shapes alone)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localfab.server.anthropic import MessageStream, to_chat, to_message
from localfab.server.errors import ApiError


def test_a_conversation_with_a_tool_round() -> None:
    chat = to_chat(
        {
            "model": "m",
            "max_tokens": 32,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"],
            "tools": [{"name": "add", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "add"},
            "messages": [
                {"role": "user", "content": "Add 2 and 40."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Use the tool."},
                        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 40}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                        {"type": "text", "text": "Thanks."},
                    ],
                },
            ],
        }
    )
    assert chat["max_tokens"] == 32 and chat["stop"] == ["END"]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 40."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'},
                }
            ],
            "reasoning_content": "Use the tool.",
        },
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "user", "content": "Thanks."},
    ]


PNG = "iVBORw0KGgo="


def test_images_become_image_url_parts_and_an_empty_conversation_one_empty_turn() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    url_image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "File: a.png"}, image],
    }
    chat = to_chat(
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "r"}]},
                {"role": "user", "content": [result, url_image]},
            ],
        }
    )
    first, _, tool, last = chat["messages"]
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}}
    assert first["content"] == [data_url, {"type": "text", "text": "What is it?"}]
    assert tool == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": [{"type": "text", "text": "File: a.png"}, data_url],
    }
    assert last["content"] == [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    # Text alone stays a string; no messages at all is one empty user turn, as llama-server.
    assert to_chat({"max_tokens": 8, "messages": []})["messages"] == [
        {"role": "user", "content": ""}
    ]
    assert to_chat({"max_tokens": 8, "system": "S", "messages": []})["messages"][1] == {
        "role": "user",
        "content": "",
    }


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": []}, "max_tokens: Field required"),
        ({"max_tokens": 8}, "messages: an array"),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role must be"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "an image's source must be of type base64 or url",
        ),
        ({"max_tokens": 8, "messages": [], "tool_choice": {"type": "all"}}, "tool_choice"),
    ],
)
def test_malformed_requests(body: dict[str, Any], says: str) -> None:
    with pytest.raises(ApiError, match=says):
        to_chat(body)


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for item in raw:
        kind, data = item.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


def test_stream_events_of_text_then_a_call() -> None:
    stream = MessageStream("m")
    raw = [stream.start("chatcmpl-abc")]
    for chunk in (
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"content": "Let me add."}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "function": {"name": "add", "arguments": '{"a": 2,'},
                            }
                        ]
                    }
                }
            ]
        },
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ' "b": 40}'}}]}}
            ]
        },
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12}},
    ):
        raw += stream.feed(chunk)
    raw += stream.end()
    events = _events(raw)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["id"] == "msg_abc"
    assert events[4]["content_block"] == {
        "type": "tool_use",
        "id": "c1",
        "name": "add",
        "input": {},
    }
    json_parts = "".join(e["delta"].get("partial_json", "") for e in events[5:7])
    assert json.loads(json_parts) == {"a": 2, "b": 40}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {
        "cache_read_input_tokens": 0,
        "input_tokens": 9,
        "output_tokens": 12,
    }


def test_a_whole_answer() -> None:
    message = to_message(
        {
            "id": "chatcmpl-x",
            "choices": [
                {
                    "finish_reason": "length",
                    "message": {"content": "Hi", "reasoning_content": "Hmm."},
                }
            ],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 2},
            },
        },
        "m",
    )
    assert message["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "text", "text": "Hi"},
    ]
    assert message["stop_reason"] == "max_tokens"
    # As llama-server: the tokens read from the cache apart from those processed.
    assert message["usage"] == {"cache_read_input_tokens": 2, "input_tokens": 3, "output_tokens": 7}


def test_an_error_ends_the_stream() -> None:
    stream = MessageStream("m")
    stream.start("chatcmpl-1")
    stream.feed({"choices": [{"delta": {"content": "Par"}}]})
    (raw,) = stream.feed({"error": {"message": "the slot crashed"}})
    event = json.loads(raw.decode().split("\ndata: ", 1)[1])
    assert event == {"type": "error", "error": {"type": "api_error", "message": "the slot crashed"}}
    assert stream.failed  # the stream ends there: no message_delta / message_stop
