"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), as llama-server serves
it: a request is turned into an OpenAI chat request, answered by the chat path, and its answer
(whole, or chunk by chunk) turned back into Anthropic's shape: content blocks of text, thinking
and tool use, its stop reasons and usage, and the streamed events (`message_start`,
`content_block_start`/`_delta`/`_stop`, `message_delta`, `message_stop`). Coding agents and the
Anthropic SDK, pointed at this server (`ANTHROPIC_BASE_URL`), use it unchanged."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from localfab.server.dialects import Chat
from localfab.server.errors import ApiError
from localfab.server.plumbing import EventStream, json_response, read_json

if TYPE_CHECKING:
    from collections.abc import Sequence

    from starlette.requests import Request
    from starlette.responses import Response

    from localfab.engine.types import Done
    from localfab.server.dialects import Probs
    from localfab.server.shapes import ResultMeta
    from localfab.server.state import Server

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
STOP_WORD = "stopping_word"  # the chat answer's field for it (see StopWordChat)
# Anthropic's sampling fields that the chat path takes under the same name.
SAME_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "stream")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as an OpenAI chat request (ApiError where malformed)."""
    if not isinstance(body.get("messages"), list):
        raise ApiError("messages: an array of messages is required")
    if "max_tokens" not in body:
        raise ApiError("max_tokens: Field required")
    chat: dict[str, Any] = {k: body[k] for k in SAME_FIELDS if k in body}
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    for i, message in enumerate(body["messages"]):
        messages += _messages(message, f"messages.{i}")
    if not body["messages"]:  # llama-server answers an empty conversation: one empty turn
        messages.append({"role": "user", "content": ""})
    chat["messages"] = messages
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(body["tools"])]
    if body.get("tool_choice"):
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if body["tool_choice"].get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def _text_of(content: Any, where: str) -> str:
    """A string, or the text of a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise ApiError(f"{where}: only text blocks are supported here")
            texts.append(str(block.get("text", "")))
        return "\n".join(texts)
    raise ApiError(f"{where}: content must be a string or an array of blocks")


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An image block as OpenAI's image_url part, as llama-server converts it."""
    given = block.get("source")
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    if source.get("type") == "base64":
        media = str(source.get("media_type") or "image/jpeg")
        url = f"data:{media};base64,{source.get('data') or ''}"
    elif source.get("type") == "url":
        url = str(source.get("url") or "")
    else:
        raise ApiError(f"{where}.source: an image's source must be of type base64 or url")
    return {"type": "image_url", "image_url": {"url": url}}


def _result_content(content: Any, where: str) -> Any:
    """A tool_result's content: its text, or OpenAI parts where it holds images."""
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "image" for b in content
    ):
        parts = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind == "image":
                parts.append(_image_part(block, f"{where}.{j}"))
        return parts
    return _text_of(content, where)


def _messages(message: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become `tool` messages, an
    assistant's tool_use blocks its `tool_calls`, thinking its `reasoning_content`."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise ApiError(f"{where}: role must be user or assistant")
    role, content = message["role"], message.get("content", "")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(f"{where}.content: a string or an array of blocks")
    texts: list[str] = []
    parts: list[dict[str, Any]] = []  # text and images in order, where there are images
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    thought: list[str] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image":
            parts.append(_image_part(block, f"{where}.content.{j}"))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            thought.append(str(block.get("thinking", "")))
        else:
            _tool_block(block, kind, role, f"{where}.content.{j}", calls, results)
    out: list[dict[str, Any]] = results
    if parts or calls or thought or not results:
        images = len(parts) > len(texts)
        turn: dict[str, Any] = {"role": role, "content": parts if images else "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        if thought:
            turn["reasoning_content"] = "\n".join(thought)
        out = [*results, turn]
    return out


def _tool_block(
    block: dict[str, Any],
    kind: str | None,
    role: str,
    where: str,
    calls: list[dict[str, Any]],
    results: list[dict[str, Any]],
) -> None:
    """An assistant's tool_use block (to `calls`) or a user's tool_result (to `results`)."""
    if kind == "tool_use" and role == "assistant":
        arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
        function = {"name": str(block.get("name", "")), "arguments": arguments}
        calls.append({"id": str(block.get("id", "")), "type": "function", "function": function})
    elif kind == "tool_result" and role == "user":
        text = _result_content(block.get("content", ""), f"{where}.content")
        if block.get("is_error") and isinstance(text, str):
            text = f"Error: {text}"
        call_id = str(block.get("tool_use_id", ""))
        results.append({"role": "tool", "tool_call_id": call_id, "content": text})
    else:
        raise ApiError(f"{where}: a {kind} block is not supported here")


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not tool.get("name"):
        raise ApiError(f"{where}: a tool needs a name")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": str(choice.get("name", ""))}}
    choices = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in choices:
        raise ApiError("tool_choice: type must be auto, any, tool or none")
    return choices[kind]


def to_message(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """A whole OpenAI chat answer as an Anthropic message."""
    choice = (chat.get("choices") or [{}])[0]
    said = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if said.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": said["reasoning_content"], "signature": ""})
    if said.get("content"):
        content.append({"type": "text", "text": said["content"]})
    for call in said.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": _arguments(function.get("arguments")),
            }
        )
    usage = _usage(chat.get("usage") or {})
    return {
        "id": _message_id(chat),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": chat.get(STOP_WORD) or None,
        "usage": usage,
    }


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    """Anthropic's usage from OpenAI's: input tokens that were processed, and apart those read
    from the cache (as llama-server counts them)."""
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "cache_read_input_tokens": cached,
        "input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def _arguments(text: Any) -> Any:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message_id(chat: dict[str, Any]) -> str:
    given = str(chat.get("id") or "")
    return "msg_" + (given.removeprefix("chatcmpl-") or secrets.token_hex(12))


class StopWordChat(Chat):
    """The chat answer with the stop string that ended the reply (Anthropic's `stop_sequence`,
    which an OpenAI answer does not carry)."""

    def stream_end(
        self, reply: ResultMeta, done: Done, tokens: Sequence[int]
    ) -> list[dict[str, Any]]:
        chunks = super().stream_end(reply, done, tokens)
        chunks[0][STOP_WORD] = done.stopping_word
        return chunks

    def final(
        self, reply: ResultMeta, done: Done, tokens: Sequence[int], probs: Probs
    ) -> dict[str, Any]:
        return {**super().final(reply, done, tokens, probs), STOP_WORD: done.stopping_word}


def event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class MessageStream:
    """OpenAI chat chunks in, Anthropic stream events out (see the module's docstring)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.index = -1
        self.open: str | None = None  # "text", "thinking" or "tool:N" (the call's index)
        self.stop_reason = "end_turn"
        self.stop_sequence: str | None = None
        self.input_tokens = 0  # the prompt's, counted before the reply (message_start's)
        self.usage: dict[str, int] = {}  # the reply's, from the last chunk
        self.failed = False  # an error ended the stream: no message_delta/message_stop follow

    def start(self, chat_id: str) -> bytes:
        message: dict[str, Any] = {
            "id": _message_id({"id": chat_id}),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "cache_read_input_tokens": 0,
                "input_tokens": self.input_tokens,
                "output_tokens": 0,
            },
        }
        return event("message_start", {"message": message})

    def _block(self, key: str, block: dict[str, Any]) -> list[bytes]:
        """Open a new content block (closing the one open), unless `key`'s is open."""
        if self.open == key:
            return []
        out = self._close()
        self.index += 1
        self.open = key
        return [*out, event("content_block_start", {"index": self.index, "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self.index, "delta": delta})

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            self.failed = True
            return [event("error", {"error": {"type": "api_error", "message": message}})]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        if chunk.get(STOP_WORD):
            self.stop_sequence = chunk[STOP_WORD]
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._block(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
                out.append(
                    self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
                )
            if delta.get("content"):
                out += self._block("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                key = f"tool:{call.get('index', 0)}"
                block = {
                    "type": "tool_use",
                    "id": call.get("id", ""),
                    "name": function.get("name", ""),
                    "input": {},
                }
                out += self._block(key, block)
                if function.get("arguments"):
                    out.append(
                        self._delta(
                            {"type": "input_json_delta", "partial_json": function["arguments"]}
                        )
                    )
            if choice.get("finish_reason"):
                self.stop_reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out

    def end(self) -> list[bytes]:
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        usage = self.usage or {"input_tokens": self.input_tokens, "output_tokens": 0}
        return [
            *self._close(),
            event("message_delta", {"delta": delta, "usage": usage}),
            event("message_stop", {}),
        ]


async def messages(server: Server, request: Request) -> Response:
    """POST /v1/messages."""
    from localfab.server.completions import chat_reply, count_chat_tokens

    body = await read_json(request, server.settings)
    chat = to_chat(body)
    model = str(body.get("model") or server.settings.public_model_name or "")
    # A stream's message_start says the prompt's tokens: counted first, as the template
    # renders them (the reply's own count comes with its end).
    n_input = await count_chat_tokens(server, chat) if chat.get("stream") else 0
    answer = await chat_reply(server, request, chat, StopWordChat)
    if isinstance(answer, EventStream):
        return EventStream(_events(answer.chunks, model, n_input), answer.on_close)
    if answer.status_code != 200:
        return answer
    return json_response(to_message(json.loads(bytes(answer.body)), model))


async def _events(chunks: AsyncIterator[bytes], model: str, n_input: int) -> AsyncIterator[bytes]:
    stream = MessageStream(model)
    stream.input_tokens = n_input
    started = False
    async for raw in chunks:
        if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(raw[len(b"data: ") :])
        if not started:
            started = True
            yield stream.start(str(chunk.get("id", "")))
            yield event("ping", {})
        for out in stream.feed(chunk):
            yield out
        if stream.failed:
            return
    if not started:
        yield stream.start("")
    for out in stream.end():
        yield out


async def count_tokens(server: Server, request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens as the chat template renders it."""
    from localfab.server.completions import count_chat_tokens

    body = await read_json(request, server.settings)
    n = await count_chat_tokens(server, to_chat({"max_tokens": 1, **body}))
    return json_response({"input_tokens": n})
