"""OpenAI's Responses API (`/v1/responses`), as llama-server serves it: a request's `input`
items (messages, function calls and their outputs) and `instructions` become a chat request
for the chat path, and its answer becomes a `response` object (output items: reasoning, a
message of `output_text`, function calls), or, streamed, the Responses events
(`response.created`, `response.output_item.added`, `response.output_text.delta`,
`response.function_call_arguments.delta`, ... `response.completed`). Stateless:
`previous_response_id` and `store` are not kept (a request names its whole conversation)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from localfab.server.errors import ApiError
from localfab.server.plumbing import EventStream, json_response, read_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from localfab.server.state import Server

# Passed on as they are (the last two: llama-server's own telemetry in the stream).
SAME_FIELDS = (
    "temperature", "top_p", "stream", "parallel_tool_calls", "return_progress",
    "timings_per_token",
)  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as an OpenAI chat request (ApiError where malformed)."""
    if body.get("previous_response_id"):
        raise ApiError("previous_response_id: this server keeps no responses; send the whole input")
    if "input" not in body:
        raise ApiError("input: Field required")
    chat: dict[str, Any] = {k: body[k] for k in SAME_FIELDS if k in body}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            _add_item(messages, item, f"input.{i}")
    else:
        raise ApiError("input: a string or an array of items")
    chat["messages"] = messages
    if body.get("tools"):
        chat["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(body["tools"])]
    chat.update(_choices(body))
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def _choices(body: dict[str, Any]) -> dict[str, Any]:
    """The request's tool choice and text format as chat fields."""
    out: dict[str, Any] = {}
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not choice.get("name"):
            raise ApiError("tool_choice: auto, none, required or a function by name")
        out["tool_choice"] = {"type": "function", "function": {"name": str(choice["name"])}}
    elif choice is not None:
        out["tool_choice"] = choice
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text"):
                raise ApiError(f"{where}: a {kind} part is not supported here")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ApiError(f"{where}: content must be a string or an array of parts")


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """One input item onto the chat messages (a function call joins the assistant turn
    before it, or opens one)."""
    if not isinstance(item, dict):
        raise ApiError(f"{where}: an item must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ApiError(f"{where}.role: user, assistant, system or developer")
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": _text(item.get("content", ""), where)})
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id", "")),
            "type": "function",
            "function": {
                "name": str(item.get("name", "")),
                "arguments": item.get("arguments", "{}"),
            },
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        messages.append(
            {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text}
        )
    elif kind != "reasoning":  # a reasoning item of an earlier answer is left out
        raise ApiError(f"{where}: a {kind} item is not supported here")


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not tool.get("name"):
        raise ApiError(f"{where}: only function tools (with a name) are supported here")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def response_object(
    rid: str,
    model: str,
    body: dict[str, Any],
    output: list[dict[str, Any]],
    *,
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The `response` object, with the request's settings echoed as the API does."""
    used = usage or {}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "text": {"format": {"type": "text"}},
        "usage": None
        if usage is None
        else {
            "input_tokens": used.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": used.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": used.get("prompt_tokens", 0) + used.get("completion_tokens", 0),
        },
    }


def output_items(said: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat answer's message as Responses output items."""
    items: list[dict[str, Any]] = []
    if said.get("reasoning_content"):
        items.append(
            {
                "type": "reasoning",
                "id": _id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": said["reasoning_content"]}],
            }
        )
    if said.get("content"):
        items.append(_message_item(_id("msg"), said["content"]))
    for call in said.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            _call_item(
                _id("fc"),
                call.get("id", ""),
                function.get("name", ""),
                function.get("arguments", ""),
            )
        )
    return items


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponseStream:
    """OpenAI chat chunks in, Responses stream events out."""

    def __init__(self, rid: str, model: str, body: dict[str, Any]) -> None:
        self.rid, self.model, self.body = rid, model, body
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the output item being written
        self.finish = "stop"
        self.usage: dict[str, Any] | None = None
        self.failed = False  # an error ended the stream (response.failed was sent)
        self.timings: dict[str, Any] | None = None  # llama-server's, from the last chunk

    def event(self, kind: str, data: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    def start(self) -> list[bytes]:
        shell = response_object(
            self.rid, self.model, self.body, [], status="in_progress", usage=None
        )
        return [
            self.event("response.created", {"response": shell}),
            self.event("response.in_progress", {"response": shell}),
        ]

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open = item
        self.output.append(item)
        index = len(self.output) - 1
        shown = {k: v for k, v in item.items() if not k.startswith("_")}
        out.append(self.event("response.output_item.added", {"output_index": index, "item": shown}))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self.event(
                    "response.content_part.added",
                    {
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "part": part,
                    },
                )
            )
        return out

    def _close(self) -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output) - 1
        out = []
        if item["type"] == "message":
            text = item.pop("_text", "")
            part = {"type": "output_text", "text": text, "annotations": []}
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self.event("response.output_text.done", {**ids, "text": text}))
            out.append(self.event("response.content_part.done", {**ids, "part": part}))
            item.update(_message_item(item["id"], text))
        elif item["type"] == "reasoning":
            text = item.pop("_text", "")
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self.event("response.reasoning_text.done", {**ids, "text": text}))
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif item["type"] == "function_call":
            ids = {"item_id": item["id"], "output_index": index}
            out.append(
                self.event(
                    "response.function_call_arguments.done", {**ids, "arguments": item["arguments"]}
                )
            )
            item["status"] = "completed"
        out.append(self.event("response.output_item.done", {"output_index": index, "item": item}))
        return out

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            self.failed = True
            failed = response_object(
                self.rid, self.model, self.body, self.output, status="failed", usage=self.usage
            )
            failed["error"] = {"code": "server_error", "message": message}
            return [
                self.event("error", {"code": "server_error", "message": message, "param": None}),
                self.event("response.failed", {"response": failed}),
            ]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        out: list[bytes] = []
        if "prompt_progress" in chunk:  # llama-server's return_progress
            shell = response_object(
                self.rid, self.model, self.body, [], status="in_progress", usage=None
            )
            progress = {"response": shell, "prompt_progress": chunk["prompt_progress"]}
            out.append(self.event("response.in_progress", progress))
        self.timings = chunk.get("timings") or self.timings
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._text_delta("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._text_delta("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def _text_delta(self, kind: str, text: str) -> list[bytes]:
        """Text of a reasoning item or of a message, in the item of that kind (opened)."""
        out: list[bytes] = []
        if self.open is None or self.open["type"] != kind:
            if kind == "reasoning":
                item = {"type": "reasoning", "id": _id("rs"), "summary": [], "_text": ""}
            else:
                item = {**_message_item(_id("msg"), "", "in_progress"), "_text": ""}
            out += self._open(item)
        assert self.open is not None
        self.open["_text"] += text
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        ids = {"item_id": self.open["id"], "output_index": len(self.output) - 1, "content_index": 0}
        extra = (
            {"timings": self.timings} if self.timings and self.body.get("timings_per_token") else {}
        )
        out.append(self.event(name, {**ids, "delta": text, **extra}))
        return out

    def _call_delta(self, call: dict[str, Any]) -> list[bytes]:
        """A piece of a function call: a new call (it has an id) opens an item."""
        out: list[bytes] = []
        function = call.get("function") or {}
        if call.get("id") or self.open is None or self.open["type"] != "function_call":
            name = function.get("name", "")
            out += self._open(_call_item(_id("fc"), call.get("id", ""), name, "", "in_progress"))
        assert self.open is not None
        if function.get("arguments"):
            self.open["arguments"] += function["arguments"]
            ids = {"item_id": self.open["id"], "output_index": len(self.output) - 1}
            delta = {**ids, "delta": function["arguments"]}
            out.append(self.event("response.function_call_arguments.delta", delta))
        return out

    def end(self) -> list[bytes]:
        out = self._close()
        status = "incomplete" if self.finish == "length" else "completed"
        done = response_object(
            self.rid, self.model, self.body, self.output, status=status, usage=self.usage or {}
        )
        # `response.completed` either way (the status says which), as llama-server sends it:
        # the openai SDK's stream helper waits for that event.
        extra = {"timings": self.timings} if self.timings else {}
        return [*out, self.event("response.completed", {"response": done, **extra})]


async def responses(server: Server, request: Request) -> Response:
    """POST /v1/responses."""
    from localfab.server.completions import chat_reply

    body = await read_json(request, server.settings)
    chat = to_chat(body)
    model = str(body.get("model") or server.settings.public_model_name or "")
    answer = await chat_reply(server, request, chat)
    rid = _id("resp")
    if isinstance(answer, EventStream):
        return EventStream(
            _events(answer.chunks, ResponseStream(rid, model, body)), answer.on_close
        )
    if answer.status_code != 200:
        return answer
    whole = json.loads(bytes(answer.body))
    choice = (whole.get("choices") or [{}])[0]
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    output = output_items(choice.get("message") or {})
    return json_response(
        response_object(rid, model, body, output, status=status, usage=whole.get("usage") or {})
    )


async def _events(chunks: AsyncIterator[bytes], stream: ResponseStream) -> AsyncIterator[bytes]:
    for out in stream.start():
        yield out
    async for raw in chunks:
        if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
            continue
        for out in stream.feed(json.loads(raw[len(b"data: ") :])):
            yield out
        if stream.failed:
            return
    for out in stream.end():
        yield out


async def input_tokens(server: Server, request: Request) -> Response:
    """POST /v1/responses/input_tokens: the prompt's tokens of a Responses request."""
    from localfab.server.completions import count_chat_tokens

    body = await read_json(request, server.settings)
    return json_response({"input_tokens": await count_chat_tokens(server, to_chat(body))})
