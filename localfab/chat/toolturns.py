"""Tool calls and results in a conversation: as the template takes them (OpenAI's message
shape) and as the history stores them (JSON beside the text, the `tools` column).

An assistant message that calls tools holds `tool_calls` ([{id, type, function: {name,
arguments}}]); each call's result is a `tool` message with the call's `tool_call_id` and
`name`, its text the tool's output as the model reads it. The history keeps the same: the
calls as {"calls": [{"id", "name", "arguments"}]}, a result as {"call_id", "name", "kind"}
(`kind`: result, error, denied, timeout, cancelled, crashed), so a reopened chat shows its
cards and renders the same prompt.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localfab.engine.callsyntax import Call

_ID_CHARS = string.ascii_letters + string.digits
RESULT_KINDS = ("result", "error", "denied", "timeout", "cancelled", "crashed")


def new_call_id(chars: int = 0) -> str:
    """A tool call's id as llama-server makes one: 32 random letters and digits (or `chars`,
    where the template takes only ids of that length: Mistral's nine)."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(chars or 32))


@dataclass(frozen=True)
class ToolCallMade:
    """A call a reply made: its id, the tool's name and its arguments (parsed where they are
    a JSON object; the model's text otherwise)."""

    id: str
    name: str
    arguments: dict[str, Any] | str

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    def message_call(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def calls_made(calls: Sequence[Call] | None, id_chars: int = 0) -> tuple[ToolCallMade, ...]:
    """The parsed calls of a reply, each with an id (the model's own where it wrote one)."""
    out = []
    for call in calls or ():
        try:
            arguments: dict[str, Any] | str = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = call.arguments
        if not isinstance(arguments, dict | str):
            arguments = call.arguments
        out.append(ToolCallMade(call.id or new_call_id(id_chars), call.name, arguments))
    return tuple(out)


def calls_json(calls: Sequence[ToolCallMade]) -> str:
    """What the history stores for an assistant message's calls ("" for none)."""
    if not calls:
        return ""
    items = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
    return json.dumps({"calls": items}, ensure_ascii=False)


def result_json(call_id: str, name: str, kind: str) -> str:
    """What the history stores for a tool message."""
    return json.dumps({"call_id": call_id, "name": name, "kind": kind}, ensure_ascii=False)


def stored_tools(text: str) -> dict[str, Any]:
    """A stored `tools` value read back ({} for none, or for one that is not ours)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def stored_calls(text: str) -> tuple[ToolCallMade, ...]:
    """The calls an assistant message stored (empty for none)."""
    out = []
    for item in stored_tools(text).get("calls") or ():
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            arguments = item.get("arguments", {})
            if not isinstance(arguments, dict | str):
                arguments = json.dumps(arguments)
            out.append(ToolCallMade(str(item.get("id") or ""), item["name"], arguments))
    return tuple(out)


def with_tools(message: dict[str, Any], role: str, tools: str) -> dict[str, Any]:
    """`message` (role and content) with what the stored `tools` add for the template."""
    data = stored_tools(tools)
    if role == "assistant":
        calls = stored_calls(tools)
        if calls:
            message["tool_calls"] = [c.message_call() for c in calls]
    elif role == "tool":
        for key, field in (("tool_call_id", "call_id"), ("name", "name")):
            if isinstance(data.get(field), str):
                message[key] = data[field]
    return message


def check_stored(value: Any, role: str, where: str) -> str:
    """An imported message's `tools` (an object, as `export_json` writes it) as stored text;
    a ValueError says what is wrong."""
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: tools must be an object")
    text = json.dumps(dict(value), ensure_ascii=False)
    if role == "assistant" and len(stored_calls(text)) != len(value.get("calls") or ()):
        raise ValueError(f"{where}: each of tools.calls needs a name")
    if role == "tool" and value.get("kind", "result") not in RESULT_KINDS:
        raise ValueError(f"{where}: tools.kind must be one of {', '.join(RESULT_KINDS)}")
    return text


# Put after each of these characters, a zero-width space breaks the text of every control token
# of the common families (<|im_end|>, <end_of_turn>, [INST], </s>) without changing what a
# person or a model reads.
_BREAK_AFTER = "<[|"
_ZWSP = "\u200b"


def defang(value: Any, holds_control_text: Callable[[str], bool]) -> Any:
    """`value` (tool definitions: JSON) with every string that the tokenizer would read as a
    control token made plain text: a server's tool description cannot end a turn or open one.

    The strings are checked together, halving only a group that holds control text: a few
    tokenizations for thousands of clean strings (each is a request to a remote server's
    tokenizer), not two per string."""
    dirty = _holding(list(dict.fromkeys(_texts(value))), holds_control_text)
    return _broken(value, dirty, holds_control_text) if dirty else value


def _texts(value: Any) -> list[str]:
    """Every string in `value`, keys too (walked without recursion)."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return out


def _holding(texts: list[str], holds_control_text: Callable[[str], bool]) -> set[str]:
    """Those of `texts` that hold a control token's text. Joined by newlines, a group holds
    one if any of its texts does (a control token spanning two texts would only be a false
    alarm, sorted out by the halves)."""
    out: set[str] = set()
    groups = [texts] if texts else []
    while groups:
        group = groups.pop()
        if not holds_control_text("\n".join(group)):
            continue
        if len(group) == 1:
            out.add(group[0])
        else:
            half = len(group) // 2
            groups += [group[:half], group[half:]]
    return out


def _broken(value: Any, dirty: set[str], holds_control_text: Callable[[str], bool]) -> Any:
    if isinstance(value, dict):
        return {
            _broken(k, dirty, holds_control_text): _broken(v, dirty, holds_control_text)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_broken(v, dirty, holds_control_text) for v in value)
    if not isinstance(value, str) or value not in dirty:
        return value
    broken = "".join(c + _ZWSP if c in _BREAK_AFTER else c for c in value)
    if holds_control_text(broken):
        broken = "".join(c for c in value if c not in "<>[]|")
    return broken
