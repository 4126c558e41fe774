"""Responses API requests turned into chat requests, and chat chunks into Responses events
(no model: the shapes alone)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localfab.server.errors import ApiError
from localfab.server.responses import ResponseStream, output_items, to_chat


def test_items_become_messages() -> None:
    chat = to_chat(
        {
            "instructions": "Be brief.",
            "max_output_tokens": 20,
            "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "add"},
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "2+40?"}],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":2}'},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
            ],
        }
    )
    assert chat["max_tokens"] == 20
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+40?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "input: Field required"),
        ({"input": 3}, "a string or an array"),
        ({"input": "x", "previous_response_id": "resp_1"}, "keeps no responses"),
        ({"input": [{"type": "web_search_call"}]}, "web_search_call item is not supported"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
    ],
)
def test_malformed_requests(body: dict[str, Any], says: str) -> None:
    with pytest.raises(ApiError, match=says):
        to_chat(body)


def test_stream_events_of_text_then_a_call() -> None:
    stream = ResponseStream("resp_1", "m", {"input": "x"})
    raw = stream.start()
    for chunk in (
        {"choices": [{"delta": {"content": "Adding."}}]},
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
    events = [json.loads(r.decode().split("\ndata: ", 1)[1]) for r in raw]
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["status"] == "completed"
    message, call = done["output"]
    assert message["content"][0]["text"] == "Adding."
    assert call["call_id"] == "c1" and json.loads(call["arguments"]) == {"a": 2, "b": 40}
    assert done["usage"]["input_tokens"] == 9 and done["usage"]["output_tokens"] == 12


def test_a_whole_answer_with_reasoning() -> None:
    items = output_items({"content": "Hi", "reasoning_content": "Hmm."})
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[1]["content"] == [{"type": "output_text", "text": "Hi", "annotations": []}]


def test_a_failed_stream_says_so_and_stops() -> None:
    stream = ResponseStream("resp_1", "m", {"input": "x"})
    stream.feed({"choices": [{"delta": {"content": "Par"}}]})
    raw = stream.feed({"error": {"message": "the slot crashed"}})
    events = [json.loads(r.decode().split("\ndata: ", 1)[1]) for r in raw]
    assert [e["type"] for e in events] == ["error", "response.failed"]
    assert events[1]["response"]["status"] == "failed"
    assert events[1]["response"]["error"]["message"] == "the slot crashed"
    assert stream.failed


def test_a_thought_streams_as_a_reasoning_item() -> None:
    stream = ResponseStream("resp_1", "m", {"input": "x"})
    raw = stream.feed({"choices": [{"delta": {"reasoning_content": "Hmm."}}]})
    raw += stream.feed({"choices": [{"delta": {"content": "Hi"}}]})
    raw += stream.end()
    events = [json.loads(r.decode().split("\ndata: ", 1)[1]) for r in raw]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.output_item.added", "response.reasoning_text.delta"]
    assert "response.reasoning_text.done" in kinds
    assert all('"_text"' not in json.dumps(e) for e in events)  # no private field leaks
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Hmm."}]
    assert message["content"][0]["text"] == "Hi"


def test_choices_and_formats() -> None:
    chat = to_chat(
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {}}}}
    )
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {}},
    }
    with pytest.raises(ApiError, match="tool_choice"):
        to_chat({"input": "x", "tool_choice": {"type": "allowed_tools"}})
