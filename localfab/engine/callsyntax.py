"""The words of tool calling: how a family writes calls (`CallSyntax`), a call (`Call`) and a
piece of one as it streams (`CallDelta`). See `callparser` for how a reply is read with them.

Hermes, Qwen2.5 and Qwen3 write a JSON object in `<tool_call>` ... `</tool_call>`, Mistral Nemo
a JSON array after `[TOOL_CALLS]`, Ministral and Devstral `[TOOL_CALLS]name[ARGS]{...}` (Mistral
Small 3.2 with `[CALL_ID]id` before `[ARGS]`), DeepSeek R1 the name between its tool-call tokens
and the arguments in a fenced JSON block, Qwen3-Coder `<function=NAME>` with one
`<parameter=K>` tag per argument, and so on. The styles:

- "json": each call is a JSON object holding the name and the arguments under two keys (and an
  id under a third, where the family writes one); several may sit in one JSON array.
- "tagged": the name is bare text up to `name_end`, the arguments a JSON object after it.
- "xml": the name as in "tagged", then one key/value pair of tags per argument; the values are
  raw text, made JSON by the tool's schema (`value_types`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Style = Literal["json", "tagged", "xml"]

# Longest name a call may have: past this the "name" is prose, not a function's name.
MAX_NAME = 128


@dataclass(frozen=True)
class CallSyntax:
    """How one family writes tool calls (see the module's docstring). Markers are given as the
    template writes them (the grammar uses them as they are; the parser ignores whitespace
    around them)."""

    style: Style
    call_start: str  # before each call
    call_end: str = ""  # after each call
    section_start: str = ""  # once before all of the calls
    section_end: str = ""  # once after them
    array: bool = False  # "json": the calls are the items of one JSON array
    name_key: str = "name"
    args_key: str = "arguments"
    id_key: str = ""
    name_end: str = ""  # "tagged", "xml": after the name
    id_start: str = ""  # "tagged": after the name, before the call's id (which ends at name_end)
    key_start: str = ""  # "xml": before an argument's name
    key_end: str = ""  # "xml": between an argument's name and its value
    value_end: str = ""  # "xml": after a value
    parallel: bool = True  # the template can write several calls in one reply
    id_chars: int = 0  # the template takes only ids of this many letters and digits (0: any)
    lead: str = ""  # "json" without markers: what may come before the call (`<|python_tag|>`)
    content_name: str = ""  # "tagged": a "call" to this name is content (Functionary's `all`)
    opened: bool = False  # the generation prompt ends with the trigger (the reply starts past it)
    family: str = ""

    @property
    def trigger(self) -> str:
        """The text that opens the calls: what the parser (and a lazy grammar) waits for."""
        return self.section_start.strip() or self.call_start.strip()


@dataclass
class Call:
    """One tool call as parsed so far."""

    name: str
    arguments: str = ""
    id: str = ""


@dataclass(frozen=True)
class CallDelta:
    """What one piece of text added to a call: its name and id when it first appears, then
    fragments of its arguments."""

    index: int
    name: str = ""
    id: str = ""
    arguments: str = ""


def typed_value(value: str, kind: str | None) -> str:
    """An XML-style argument's value as JSON: a string unless its schema type says otherwise
    (or, without a schema, unless it reads as JSON)."""
    if kind != "string":
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        else:
            if kind is not None or not isinstance(parsed, str):
                return json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)
