"""Chat messages as clients send them (OpenAI's shape), checked and made ready for a template.

Besides `{role, content}`: an assistant's `reasoning_content` (a thinking model's earlier
thought), an assistant's `tool_calls` (its content may then be null) and a `tool` message's
`tool_call_id` and `name`. Arguments, which OpenAI sends as a JSON string, reach the template as
an object where they are one (Hugging Face templates expect `arguments | tojson` to work), as
llama.cpp passes them.
"""

from __future__ import annotations

import json
from typing import Any

from localfab.chat.templates import ROLES
from localfab.errors import UsageError


def validate_messages(messages: object) -> list[dict[str, Any]]:
    """Check a list of chat messages; raise UsageError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise UsageError("'messages' must be a non-empty array")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(i: int, message: object) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise UsageError(f"messages[{i}] must be an object with 'role' and 'content'")
    role = message.get("role")
    if role == "developer":  # OpenAI's newer name for the system role, as llama.cpp maps it
        role = "system"
    if role not in ROLES:
        raise UsageError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {role!r}")
    item: dict[str, Any] = {"role": role, "content": _content(i, message.get("content"))}
    # A thinking model's earlier reasoning: the template decides whether it is shown.
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise UsageError(f"messages[{i}].reasoning_content must be a string")
    if reasoning and role == "assistant":
        item["reasoning_content"] = reasoning
    calls = message.get("tool_calls")
    if calls is not None and role == "assistant":
        item["tool_calls"] = _tool_calls(i, calls)
    if role == "tool":
        for key in ("tool_call_id", "name"):
            value = message.get(key)
            if value is not None and not isinstance(value, str):
                raise UsageError(f"messages[{i}].{key} must be a string")
            if value:
                item[key] = value
    return item


def _content(i: int, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts: the text ones, a line apart
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise UsageError(f"messages[{i}].content: only text parts are supported")
            texts.append(str(part.get("text", "")))
        content = "\n".join(texts)  # as llama-server joins them
    if not isinstance(content, str):
        raise UsageError(f"messages[{i}].content must be a string")
    return content


def _tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise UsageError(f"messages[{i}].tool_calls must be an array")
    out = []
    for k, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise UsageError(f"{where} must be an object with function.name and arguments")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                parsed = arguments  # not JSON: the template gets the text as it is
            arguments = parsed
        elif arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            raise UsageError(f"{where}.function.arguments must be a JSON string or an object")
        item: dict[str, Any] = {
            "type": "function",
            "function": {"name": function["name"], "arguments": arguments},
        }
        if isinstance(call.get("id"), str):
            item["id"] = call["id"]
        out.append(item)
    return out
