"""Small models' tool calls without their template's markers (`engine.loosecalls`): a reply
that is only a JSON call, bare or in a ```json block, maybe left one bracket short, naming an
offered tool with arguments its schema takes, is a call once the reply ends; everything else
stays text. Fed through the token step's `ToolStep` in every chunking, as replies stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localfab.chat.tools import ToolRequest, plan_tools
from localfab.chat.toolsyntax import GENERIC
from localfab.engine.callsyntax import CallSyntax
from localfab.engine.loosecalls import LooseCalls, heal
from localfab.engine.toolcalls import ToolCalling, ToolStep
from tests.engine.test_toolcalls import HERMES, WEATHER, chunkings, template

WEATHER_MCP = {**WEATHER, "function": {**WEATHER["function"], "name": "weather__get_weather"}}
CLOCK = {
    "type": "function",
    "function": {"name": "clock__now", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER_MCP, CLOCK]
FUNCTIONS = [(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS]
PARIS = ("weather__get_weather", {"city": "Paris"})

# (the reply's answer, the calls it is; None: it stays text)
CALLS: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
    # Qwen2.5-Coder 0.5B's reply of the issue: no <tool_call> tags, one brace short.
    ('{"name": "weather__get_weather", "arguments": {"city": "Paris"}', [PARIS]),
    ('{"name": "weather__get_weather", "arguments": {"city": "Paris"}}', [PARIS]),
    ('\n\n  {"name": "weather__get_weather", "arguments": {"city": "Paris"}}\n', [PARIS]),
    ('```json\n{"name": "weather__get_weather", "arguments": {"city": "Paris"}}\n```', [PARIS]),
    ('```\n{"name": "weather__get_weather", "arguments": {"city": "Paris"}}\n```\n', [PARIS]),
    ('```json\n{"name": "weather__get_weather", "arguments": {"city": "Paris"', [PARIS]),
    ('{"name": "weather__get_weather", "arguments": {"city": "Paris', [PARIS]),
    ('{"name": "weather__get_weather", "arguments": {"city": "Paris",', [PARIS]),
    (
        '{"name": "weather__get_weather", "parameters": {"city": "Paris", "days": 2}}',
        [("weather__get_weather", {"city": "Paris", "days": 2})],
    ),
    (
        '{"arguments": {"city": "Paris\\n\\"old\\""}, "name": "weather__get_weather"}',
        [("weather__get_weather", {"city": 'Paris\n"old"'})],
    ),
    ('{"name": "clock__now"}', [("clock__now", {})]),
    ('{"name": "clock__now", "arguments": {}}', [("clock__now", {})]),
    (
        '{"type": "function", "function": {"name": "weather__get_weather", '
        '"arguments": "{\\"city\\": \\"Paris\\"}"}}',
        [PARIS],
    ),
    (
        '[{"name": "weather__get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "clock__now", "arguments": {}}]',
        [PARIS, ("clock__now", {})],
    ),
]

TEXT = [
    "Paris is sunny today.",
    'The call is {"name": "weather__get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "weather__get_weather", "arguments": {"city": "Paris"}} is what I would call.',
    '```json\n{"name": "weather__get_weather", "arguments": {"city": "Paris"}}\n```\nDone.',
    '```python\n{"name": "weather__get_weather", "arguments": {"city": "Paris"}}\n```',
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # not the offered name
    '{"name": "weather__get_weather", "arguments": {"town": "Paris"}}',  # not its property
    '{"name": "weather__get_weather", "arguments": {"days": 2}}',  # its required city missing
    '{"name": "weather__get_weather", "arguments": {"city": 75001}}',  # not a string
    '{"name": "weather__get_weather", "arguments": {"city": "Paris", "days": "2"}}',
    '{"name": "weather__get_weather", "arguments": {"city": "Paris"}, "why": "asked"}',
    '{"name": "weather__get_weather", "arguments": ["Paris"]}',
    '{"city": "Paris", "sky": "clear"}',
    '{"name": "weather__get_weather", "argu',
    "[Paris](https://en.wikipedia.org/wiki/Paris) is sunny.",
    "{{city}} is a template placeholder.",
    "[]",
    "[" * 5000 + "]" * 5000,
    "{" * 5000,
    '{"name": "clock__now", "arguments": {"deep": ' + "[" * 20_000,
]


def stream(calling: ToolCalling, chunks: list[str]) -> tuple[list[str], str, list[Any], Any]:
    """What the token step gives out for `chunks`: the content pieces before the end, the
    content at the end, the calls put together from their deltas, and the parser."""
    step = ToolStep(calling)
    early: list[str] = []
    deltas = []
    for chunk in chunks:
        parts, calls = step.take((("content", chunk),))
        early += [text for kind, text in parts if kind == "content"]
        deltas += calls
    parts, calls = step.take((), final=True)
    late = "".join(text for kind, text in parts if kind == "content")
    deltas += calls
    made: dict[int, list[str]] = {}
    for d in deltas:
        got = made.setdefault(d.index, ["", ""])
        got[0] += d.name
        got[1] += d.arguments
    assembled = [(name, json.loads(args)) for _, (name, args) in sorted(made.items())]
    return early, late, assembled, step.parser


def lenient(syntax: CallSyntax = GENERIC, *, parallel: bool = True) -> ToolCalling:
    names = frozenset(name for name, _ in FUNCTIONS)
    return ToolCalling(syntax, names, parallel=parallel, loose=LooseCalls.of(FUNCTIONS))


@pytest.mark.parametrize(("text", "want"), CALLS)
@pytest.mark.parametrize("family", ["generic", "hermes"])
def test_a_reply_that_is_only_a_json_call_is_that_call(
    text: str, want: list[tuple[str, dict[str, Any]]], family: str
) -> None:
    """Whole or streamed in any chunking: nothing of it is shown as text, and the calls come
    at the end, in the reply's `tool_calls` and as deltas alike."""
    syntax = GENERIC if family == "generic" else HERMES
    assert syntax is not None
    for chunks in chunkings(text, 3):
        early, late, assembled, parser = stream(lenient(syntax), chunks)
        assert (early, late) == ([], ""), chunks
        assert assembled == want
        assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == want
        assert parser.content == ""


@pytest.mark.parametrize("text", TEXT)
def test_anything_else_stays_text(text: str) -> None:
    for chunks in chunkings(text, 5):
        early, late, assembled, parser = stream(lenient(), chunks)
        assert "".join(early) + late == text.lstrip()
        assert assembled == [] and parser.calls == []
        assert parser.content == text.lstrip()


def test_text_that_cannot_be_a_call_is_shown_as_it_comes() -> None:
    """Only a reply that may still be a bare call is held back: prose streams at once, and
    JSON followed by prose is given out where the prose starts."""
    step = ToolStep(lenient())
    assert step.take((("content", "Paris"),)) == ((("content", "Paris"),), ())
    step = ToolStep(lenient())
    held = '{"name": "weather__get_weather", "arguments": {"city": "Paris"}}'
    assert step.take((("content", held),)) == ((), ())
    parts, _ = step.take((("content", " is the call"),))
    assert parts == (("content", held + " is the call"),)
    step = ToolStep(lenient())
    assert step.take((("content", "```python\n"),)) == ((("content", "```python\n"),), ())


def test_one_call_only_where_the_reply_may_make_one() -> None:
    two = CALLS[-1][0]
    _, late, assembled, _ = stream(lenient(parallel=False), [two])
    assert (late, assembled) == (two, [])


def test_the_familys_own_calls_are_read_as_before() -> None:
    """A `<tool_call>` call is the family's: read by its parser, the text before it shown."""
    text = 'Let me look.\n<tool_call>\n{"name": "clock__now", "arguments": {}}\n</tool_call>'
    for chunks in chunkings(text, 9):
        early, late, assembled, _ = stream(lenient(HERMES or GENERIC), chunks)
        assert "".join(early) + late == "Let me look.\n"
        assert assembled == [("clock__now", {})]


def test_reasoning_passes_and_the_answer_is_read_after_it() -> None:
    step = ToolStep(lenient())
    parts, _ = step.take((("reasoning", "I should call it."), ("content", PARIS_TEXT)))
    assert parts == (("reasoning", "I should call it."),)
    parts, calls = step.take((), final=True)
    assert parts == () and [(c.name, c.arguments) for c in calls] == [
        ("weather__get_weather", '{"city": "Paris"}')
    ]


PARIS_TEXT = '{"name": "weather__get_weather", "arguments": {"city": "Paris"}'


def test_only_lenient_plans_read_bare_calls() -> None:
    """`serve` keeps llama-server's reading by default (the bare call is text); the app and
    `run` plan with `lenient`."""
    chat = template("Qwen-Qwen2.5-7B-Instruct.jinja")
    request = ToolRequest(tuple(TOOLS))
    strict = plan_tools(request, chat).calling
    assert strict.loose is None
    early, late, assembled, _ = stream(strict, [PARIS_TEXT])
    assert ("".join(early) + late, assembled) == (PARIS_TEXT, [])
    loose = plan_tools(request, chat, lenient=True).calling
    early, late, assembled, _ = stream(loose, [PARIS_TEXT])
    assert ("".join(early) + late, assembled) == ("", [PARIS])
    named = plan_tools(ToolRequest(tuple(TOOLS), "required", "clock__now"), chat, lenient=True)
    early, late, assembled, _ = stream(named.calling, [PARIS_TEXT])
    assert ("".join(early) + late, assembled) == (PARIS_TEXT, [])  # a tool not offered


def test_healing_closes_what_the_reply_left_open() -> None:
    assert heal('{"a": {"b": "c') == '{"a": {"b": "c"}}'
    assert heal('{"a": "x\\') == '{"a": "x"}'
    assert heal('{"a": [1, 2,') == '{"a": [1, 2]}'
    assert heal('{"a": 1}') == '{"a": 1}'
    assert heal('{"a": "}"') == '{"a": "}"}'
