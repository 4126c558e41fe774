"""How a chat template writes tool calls, read off the template itself.

`tool_syntax` renders the template with made-up calls (one call, two calls, a reply without one)
and reads the markers around them: what opens and closes a call (or all of a reply's calls),
whether the name and arguments sit in one JSON object (and under which keys), or the name is bare
text followed by JSON arguments or by one tag pair per argument. The result is checked by parsing
the template's own rendering of two calls back; a template whose calls cannot be read that way,
or that writes no calls at all, gets None (unless its text states a syntax that `STATED`
knows), and then `GENERIC` (below) applies: the tools are
described in a system message and the model answers with `<tool_call>` JSON, as Hermes-style
models do.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from localfab.chat.templates import ChatTemplate
from localfab.engine.callparser import CallParser
from localfab.engine.callsyntax import CallSyntax, Style
from localfab.engine.reasoning import TAG_PAIRS
from localfab.errors import UsageError

_NAME1, _NAME2 = "FFF_FIRST_FUN_F", "SSS_SECOND_FUN_S"
PYTHON_TAG = "<|python_tag|>"
_ID = "call00001"  # nine letters and digits, as Mistral's templates want them
_ARGS = {"AA_ARG_FST_AA": "XXX", "BB_ARG_SND_BB": "YYY"}
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string"} for k in _ARGS},
                "required": list(_ARGS),
            },
        },
    }
    for name in (_NAME1, _NAME2)
]

GENERIC = CallSyntax("json", "<tool_call>\n", "\n</tool_call>", family="generic")

GENERIC_PROMPT = (
    "You can call tools. To call one, reply with\n"
    '<tool_call>\n{"name": <the tool\'s name>, "arguments": <its arguments as a JSON object>}'
    "\n</tool_call>\n(one such block per call); to answer without a tool, reply in plain text."
    "\n\nThe tools:\n"
)


def _call(name: str, n: int, call_id: str = "") -> dict[str, Any]:
    return {
        "id": call_id or f"call0000{n}",
        "type": "function",
        "function": {"name": name, "arguments": dict(_ARGS)},
    }


def _diff(base: str, text: str) -> str:
    """`text` where it differs from `base`, widened to whole markers at both ends."""
    start = len(os.path.commonprefix([base, text]))
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in ">]}":
        start -= 1
    tail = len(os.path.commonprefix([base[start:][::-1], text[start:][::-1]]))
    end = len(text) - tail
    while end < len(text) and not text[end].isspace() and text[end - 1] not in ">]}":
        end += 1
    return text[start:end]


def _renders(template: ChatTemplate) -> tuple[str, str | None, int] | None:
    """The template's text for one call and for two (None: it cannot write two at once),
    each as it differs from a reply without calls, and the length of id it takes (0: any);
    None when it writes no call."""
    user = [{"role": "user", "content": "UUU"}]
    variables = {"tools": _PROBE_TOOLS}

    def render(calls: list[dict[str, Any]] | None) -> str:
        reply: dict[str, Any] = {"role": "assistant", "content": ""}
        if calls:
            reply["tool_calls"] = calls
        return template.render(user + [reply], add_generation_prompt=False, variables=variables)

    try:
        one = render([_call(_NAME1, 1)])
    except UsageError:
        return None
    try:  # an id of llama-server's length: some templates (Mistral's) take nine characters only
        render([_call(_NAME1, 1, "c" * 32)])
        id_chars = 0
    except UsageError:
        id_chars = len(_ID)
    try:
        base = render(None)
    except UsageError:  # a template that wants some content in a reply
        try:
            base = template.render(
                [*user, {"role": "assistant", "content": "C"}],
                add_generation_prompt=False,
                variables=variables,
            )
        except UsageError:
            return None
    if _NAME1 not in one:
        return None
    try:
        two: str | None = _diff(base, render([_call(_NAME1, 1), _call(_NAME2, 2)]))
    except UsageError:
        two = None
    return _diff(base, one), two, id_chars


def _json_object_at(text: str, name: str) -> tuple[int, int, dict[str, Any]] | None:
    """The innermost JSON object in `text` holding `name` as a value: start, end, object."""
    at = text.find(json.dumps(name))
    decoder = json.JSONDecoder()
    start = text.rfind("{", 0, at)
    while start >= 0:
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            obj, end = None, -1
        if isinstance(obj, dict) and end > at and name in obj.values():
            return start, end, obj
        start = text.rfind("{", 0, start)
    return None


def _common_suffix(a: str, b: str) -> str:
    n = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return a[len(a) - n :] if n else ""


def _split_markers(prefix: str, suffix: str, middle: str | None) -> dict[str, str] | None:
    """Per-call and once-only markers from the text before a first call, after a last one,
    and between two calls (None: the template writes one call at a time). Markers are cut
    where one ends (after `>`, `]` or `}`), never inside one."""
    if middle is None:
        return {"call_start": prefix, "call_end": suffix}
    if not middle.strip():
        return {"section_start": prefix, "section_end": suffix, "call_start": ""}
    n = len(os.path.commonprefix([suffix, middle]))
    while n > 0 and middle[n - 1] not in ">]}":
        n -= 1
    start = middle[n:].strip()
    at = prefix.rfind(start) if start else -1
    if at < 0 or prefix[at + len(start) :].strip():
        return None
    return {
        "section_start": prefix[:at],
        "section_end": suffix[n:],
        "call_start": prefix[at:],
        "call_end": middle[:n],
    }


def _json_syntax(one: str, two: str | None) -> CallSyntax | None:
    found = _json_object_at(one, _NAME1)
    if found is None:
        return None
    start, end, obj = found
    keys = {"name_key": "", "args_key": "", "id_key": ""}
    for key, value in obj.items():
        if value == _NAME1:
            keys["name_key"] = key
        elif value == _ARGS or value == json.dumps(_ARGS):
            keys["args_key"] = key
        elif value == _ID:
            keys["id_key"] = key
    if not keys["name_key"] or not keys["args_key"]:
        return None
    prefix, suffix = one[:start], one[end:]
    array = prefix.rstrip().endswith("[") and suffix.lstrip().startswith("]")
    if array:
        prefix = prefix.rstrip()[:-1]
        suffix = suffix.lstrip()[1:]
        return CallSyntax(
            "json",
            "",
            section_start=prefix,
            section_end=suffix,
            array=True,
            name_key=keys["name_key"],
            args_key=keys["args_key"],
            id_key=keys["id_key"],
        )
    middle = None
    if two is not None:
        second = _json_object_at(two, _NAME2)
        first = _json_object_at(two, _NAME1)
        if first is None or second is None:
            return None
        middle = two[first[1] : second[0]]
    markers = _split_markers(prefix, suffix, middle)
    if markers is None:
        return None
    return replace(
        _marked("json", markers),
        name_key=keys["name_key"],
        args_key=keys["args_key"],
        id_key=keys["id_key"],
    )


def _tagged_syntax(one: str, two: str | None) -> CallSyntax | None:
    """Name as bare text: JSON arguments after it ("tagged") or tags per argument ("xml")."""
    at = one.find(_NAME1)
    after = at + len(_NAME1)
    prefix = one[:at]
    args_at = one.find("{", after)
    found = _json_object_at(one[args_at:], "XXX") if args_at >= 0 else None
    if found is not None and found[0] == 0 and found[2] == _ARGS:
        name_end = one[after:args_at]
        last = args_at + found[1]
        fields: dict[str, str] = {"name_end": name_end}
        if _ID in name_end:  # Mistral Small 3.2: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
            fields["id_start"], fields["name_end"] = name_end.split(_ID, 1)
        style = "tagged"
    else:
        k1, v1 = one.find("AA_ARG_FST_AA", after), one.find("XXX", after)
        k2, v2 = one.find("BB_ARG_SND_BB", after), one.find("YYY", after)
        if not after <= k1 < v1 < k2 < v2:
            return None
        # (Not from inside a marker: `>` ends the name's marker, not the key's.)
        key_start = _common_suffix(one[after:k1], one[v1 + 3 : k2]).lstrip(">]}")
        if not key_start.strip():
            return None
        between = one[v1 + 3 : k2]
        fields = {
            "name_end": one[after:k1][: k1 - after - len(key_start)],
            "key_start": key_start,
            "key_end": one[k1 + len("AA_ARG_FST_AA") : v1],
            "value_end": between[: len(between) - len(key_start)],
        }
        value_end = fields["value_end"].strip()
        last = one.find(value_end, v2) + len(value_end)
        style = "xml"
    if not fields["name_end"].strip() and "\n" not in fields["name_end"]:
        return None  # (a line break alone ends a name: Functionary v3.2's `>>>name\n{...}`)
    suffix = one[last:]
    middle = None
    if two is not None:
        second = two.find(_NAME2)
        if second < 0:
            return None
        # From the end of the first call's arguments to the second call's name.
        end1 = _end_of_first(two, style, fields)
        middle = two[end1:second] if end1 >= 0 else None
        prefix_two = two[: two.find(_NAME1)]
        if middle is None or prefix_two != prefix:
            return None
    markers = _split_markers(prefix, suffix, middle)
    if markers is None:
        return None
    return replace(
        _marked("tagged" if style == "tagged" else "xml", markers),
        name_end=fields["name_end"],
        id_start=fields.get("id_start", ""),
        key_start=fields.get("key_start", ""),
        key_end=fields.get("key_end", ""),
        value_end=fields.get("value_end", ""),
    )


def _marked(style: Style, markers: Mapping[str, str]) -> CallSyntax:
    return CallSyntax(
        style,
        markers.get("call_start", ""),
        markers.get("call_end", ""),
        section_start=markers.get("section_start", ""),
        section_end=markers.get("section_end", ""),
    )


def _end_of_first(two: str, style: str, fields: Mapping[str, str]) -> int:
    """Where the first call's arguments end in the rendering of two calls."""
    at = two.find(_NAME1) + len(_NAME1)
    if style == "tagged":
        start = two.find("{", at)
        try:
            _, end = json.JSONDecoder().raw_decode(two, start)
        except ValueError:
            return -1
        return int(end)
    value_end = fields["value_end"].strip()
    v2 = two.find("YYY", at)
    return two.find(value_end, v2) + len(value_end) if v2 >= 0 else -1


def _own_marker(text: str) -> str:
    """The part of a rendered section start that the model writes: what the template writes
    before it on the same turn (a header line, an empty thinking block) goes."""
    for _, end in TAG_PAIRS:
        if end in text:
            text = text[text.rindex(end) + len(end) :]
    stripped = text.strip()
    if "\n" in stripped:
        text = stripped.rsplit("\n", 1)[-1]
    # A marker has markup in it; a bare word ("assistant") is the turn's header.
    return text if any(c in text for c in "<[|>") else ""


def _first_marker(text: str) -> str:
    """A section's end as the model writes it: its first marker (an end-of-turn token the
    template writes after it is not the model's to write)."""
    match = re.match(r"\s*[^>\]]*[>\]]", text)
    return match.group(0) if match else text


def _round_trips(syntax: CallSyntax, one: str, two: str | None) -> bool:
    """Whether parsing the template's own rendering gives back the calls it rendered."""
    for text, names in ((one, [_NAME1]), (two, [_NAME1, _NAME2])):
        if text is None:
            continue
        parser = CallParser(syntax)
        parser.feed(text)
        parser.finish()
        got = [(c.name, json.loads(c.arguments or "null")) for c in parser.calls]
        if got != [(n, _ARGS) for n in names]:
            return False
    return True


# Templates that tell the model how to call in words but never render a call themselves:
# (what their source says, the syntax it describes).
STATED = (
    # Granite 3.x: "respond only with <|tool_call|> followed by a JSON list of tools used".
    (
        "<|tool_call|> followed by a JSON list",
        CallSyntax("json", "", section_start="<|tool_call|>", array=True, family="granite"),
    ),
)


@functools.lru_cache(maxsize=16)
def tool_syntax(template: ChatTemplate) -> CallSyntax | None:
    """How `template` writes tool calls; None where it writes none (or none readable)."""
    derived = _derived(template)
    if derived is None:
        return next((syntax for said, syntax in STATED if said in template.source), None)
    return derived


def _derived(template: ChatTemplate) -> CallSyntax | None:
    rendered = _renders(template)
    if rendered is None:
        return None
    one, two, id_chars = rendered
    quoted = json.dumps(_NAME1) in one  # the name is a JSON string: a JSON call object
    syntax = _json_syntax(one, two) if quoted else _tagged_syntax(one, two)
    if syntax is None or not syntax.trigger and syntax.style != "json":
        return None
    syntax = replace(
        syntax,
        section_start=_own_marker(syntax.section_start),
        section_end=_first_marker(syntax.section_end),
        parallel=two is not None,
        id_chars=id_chars,
    )
    try:
        ok = _round_trips(syntax, one, two)
    except ValueError:
        ok = False
    return _opening(template, syntax) if ok else None


def _opening(template: ChatTemplate, syntax: CallSyntax) -> CallSyntax:
    """`syntax` with what the template says of a reply's start: whether its generation prompt
    ends with the calls' opening (Functionary v3.2's `>>>`: the reply begins with a call's
    name), and the name under which it writes plain content (its `>>>all\n`)."""
    user = [{"role": "user", "content": "UUU"}]
    trigger = syntax.trigger
    try:
        opened = template.render(user).endswith(trigger) and bool(trigger)
        said = template.render(
            [*user, {"role": "assistant", "content": "CCC"}], add_generation_prompt=False
        )
    except UsageError:
        return syntax
    before = said[: said.rfind("CCC")]
    at = before.rfind(trigger) if trigger and syntax.style == "tagged" else -1
    name = before[at + len(trigger) :] if at >= 0 else ""
    if syntax.name_end and name.endswith(syntax.name_end):
        name = name[: -len(syntax.name_end)]
    content_name = name if name.isalnum() else ""
    # Llama 3.x may write its JSON call after `<|python_tag|>` (the tag of its code calls).
    lead = PYTHON_TAG if not trigger and PYTHON_TAG in template.source else ""
    return replace(syntax, opened=opened, content_name=content_name, lead=lead)


@functools.lru_cache(maxsize=16)
def shows_tools(template: ChatTemplate) -> bool:
    """Whether `template` writes the tools it is given into the prompt (some that write calls,
    such as DeepSeek R1's distills, do not: the tools then go into the system message)."""
    try:
        text = template.render(
            [{"role": "user", "content": "UUU"}], variables={"tools": _PROBE_TOOLS}
        )
    except UsageError:
        return False
    return _NAME1 in text
