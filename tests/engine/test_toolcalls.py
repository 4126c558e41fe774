"""Tool calls read off real chat templates and parsed from model output (no model needed).

The corpus is llama.cpp's own expected parses (`tests/test-chat.cpp` of the llama.cpp that
llama-cpp-python ships, cut to the families whose templates are in `templates/`): for each
recorded reply, the template's call syntax is derived from the template alone, the reply is
parsed whole and in every chunking, and the result must be llama.cpp's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localfab.chat.templates import ChatTemplate
from localfab.chat.thinking import template_thinking
from localfab.chat.tools import ToolRequest, recipient_only, tool_messages
from localfab.chat.toolsyntax import GENERIC, tool_syntax
from localfab.engine.callparser import CallParser
from localfab.engine.callsyntax import CallSyntax
from localfab.engine.reasoning import ReasoningSplit
from localfab.errors import UsageError
from tests.engine.assembled import Assembled

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
CORPUS = json.loads((HERE / "toolcall_corpus.json").read_text(encoding="utf-8"))


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "file", "<s>", "</s>")


def parse(syntax: CallSyntax, text: str, chunks: list[str] | None = None) -> tuple[str, Any]:
    """Content and calls of `text` fed in `chunks`, put together as a streaming client does;
    checked against the parser's own whole answer."""
    parser = CallParser(syntax)
    content, assembled = "", Assembled()
    pieces = [p for chunk in (chunks or [text]) for p in parser.feed(chunk)] + parser.finish()
    for kind, value in pieces:
        if kind == "content":
            content += value
        else:
            assembled.add(value)
    assert content == parser.content
    calls = [(c.name, c.arguments) for c in parser.calls]
    if not parser.broken:
        assert [(c.name, c.arguments) for c in assembled.calls] == calls
    else:  # a call was streamed before its text broke: the whole answer drops it, not others
        streamed = [(c.name, c.arguments) for c in assembled.calls]
        assert [c for c in calls if c in streamed] == calls and len(streamed) > len(calls)
    return content, calls


def chunkings(text: str, seed: int) -> list[list[str]]:
    """The text whole, one character at a time, in twos and threes, and cut at random."""
    rng = random.Random(seed)
    out = [[text], list(text), [text[i : i + 2] for i in range(0, len(text), 2)]]
    out.append([text[i : i + 3] for i in range(0, len(text), 3)])
    cuts = sorted(rng.sample(range(1, len(text)), min(8, max(len(text) - 1, 0))))
    out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


# Replies llama.cpp parses with rules of its own that the derived syntax does not have: its
# Qwen3-Coder parser also takes a call written without the `<tool_call>` that opens it, and it
# ends a reasoning block that was never closed where a call begins (here a call written while
# thinking is reasoning, as everywhere else).
DIFFERS = {
    "llama.cpp tests/test-chat.cpp:2317": "a call inside an unclosed reasoning block",
    "llama.cpp tests/test-chat.cpp:2334": "a call inside an unclosed reasoning block",
    "llama.cpp tests/test-chat.cpp:3570": "a call without its <tool_call>",
    "llama.cpp tests/test-chat.cpp:3581": "a call without its <tool_call>",
    "llama.cpp tests/test-chat.cpp:3597": "a call without its <tool_call>",
}


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['template'].removesuffix('.jinja')}:{case['source'].rsplit(':', 1)[-1]}"


CASES = [
    pytest.param(
        case,
        id=_case_id(case),
        marks=[pytest.mark.xfail(reason=DIFFERS[case["source"]], strict=True)]
        if case["source"] in DIFFERS
        else [],
    )
    for case in CORPUS
]


@pytest.mark.parametrize("case", CASES)
def test_llama_cpps_expected_parses(case: dict[str, Any]) -> None:
    chat = template(case["template"])
    syntax = tool_syntax(chat)
    assert syntax is not None, "the template's call syntax could not be read"
    text, reasoning = case["output"], ""
    thinking = template_thinking(chat, case["generation_prompt"])
    if thinking is not None and not case["reasoning_none"]:
        split = ReasoningSplit(thinking)
        parts = [*split.feed(text), *split.finish()]
        reasoning = "".join(t for k, t in parts if k == "reasoning")
        text = "".join(t for k, t in parts if k == "content")
    expected = case["expected"]
    want_calls = [(c["name"], json.loads(c["arguments"])) for c in expected["tool_calls"]]
    results = {json.dumps(parse(syntax, text, chunks)) for chunks in chunkings(text, 7)}
    assert len(results) == 1, "the chunkings parse differently"
    content, calls = json.loads(results.pop())
    assert [(n, json.loads(a)) for n, a in calls] == want_calls
    assert content.strip() == expected["content"].strip()
    assert reasoning.strip() == expected["reasoning_content"].strip()


# Each family's template: how it writes calls (style, the text that opens them) and whether it
# writes several in one reply.
FAMILIES = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("json", "<tool_call>", True),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("json", "<tool_call>", True),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("json", "<tool_call>", True),
    "Qwen-Qwen3-0.6B.jinja": ("json", "<tool_call>", True),
    "Qwen-QwQ-32B.jinja": ("json", "<tool_call>", True),
    "MiMo-VL.jinja": ("json", "<tool_call>", True),
    "ibm-granite-granite-4.0.jinja": ("json", "<tool_call>", True),
    "Qwen3-Coder.jinja": ("xml", "<tool_call>\n<function=", True),
    "Qwen3.5-4B.jinja": ("xml", "<tool_call>\n<function=", True),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("xml", "<tool_call>\n<function=", True),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("json", "", False),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("json", "", False),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("json", "[TOOL_CALLS]", True),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("tagged", "[TOOL_CALLS]", True),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("tagged", "[TOOL_CALLS]", True),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("tagged", "[TOOL_CALLS]", True),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("tagged", "<｜tool▁calls▁begin｜>", True),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("tagged", "<｜tool▁calls▁begin｜>", True),
    "meetkai-functionary-medium-v3.1.jinja": ("tagged", "<function=", True),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("json", "<|START_ACTION|>", True),
    "Cohere2MoE.jinja": ("json", "<|START_ACTION|>", True),
    "unsloth-Apriel-1.5.jinja": ("json", "<tool_calls>", True),
    "MiniMax-M1.jinja": ("json", "<tool_calls>", True),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ARGS = [
    {"city": 'Zürich "old town"', "days": 3},
    {"city": "東京", "days": 1},
]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_reads_back_the_calls_its_template_writes(name: str) -> None:
    """The syntax read off the template parses the template's own rendering of a reply with
    calls (unicode, quotes, numbers in the arguments) back into those calls, and the template
    shows the tools to the model."""
    style, trigger, parallel = FAMILIES[name]
    chat = template(name)
    syntax = tool_syntax(chat)
    assert syntax is not None
    assert (syntax.style, syntax.trigger, syntax.parallel) == (style, trigger, parallel)
    n = 2 if parallel else 1
    calls = [
        {
            "id": f"call{i}abcd",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ARGS[i]},
        }
        for i in range(n)
    ]
    user = [{"role": "user", "content": "Weather?"}]
    asked = ToolRequest((WEATHER,))
    shown = chat.render(tool_messages(chat, user, asked), variables={"tools": [WEATHER]})
    assert "get_weather" in shown  # the tools are in the prompt, by the template or not
    text = chat.render(
        [*user, {"role": "assistant", "content": "", "tool_calls": calls}],
        add_generation_prompt=False,
        variables={"tools": [WEATHER]},
    )
    reply = text[text.rindex("Weather?") + len("Weather?") :]  # the reply, after the question
    reply = reply[reply.index(trigger) if trigger else reply.index("{") :]
    _, got = parse(syntax, reply)
    assert [(n, json.loads(a)) for n, a in got] == [("get_weather", a) for a in ARGS[:n]]


def test_a_template_that_writes_no_calls_gets_the_generic_syntax() -> None:
    """The test model's built-in template and a thinking template without tools know no
    calls: None (the server then describes the tools in a system message, GENERIC)."""
    from localfab.chat.templates import BUILTIN_TEMPLATES

    assert tool_syntax(ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma")) is None
    assert tool_syntax(template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")) is None
    assert GENERIC.trigger == "<tool_call>"


HERMES = tool_syntax(template("Qwen-Qwen2.5-7B-Instruct.jinja"))
MISTRAL = tool_syntax(template("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
CODER = tool_syntax(template("Qwen3-Coder.jinja"))
OPEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {}}'
CALL = OPEN_CALL + "\n</tool_call>"
DEVSTRAL = tool_syntax(template("unsloth-mistral-Devstral-Small-2507.jinja"))


def test_a_template_that_states_its_syntax_in_words_gets_that_syntax() -> None:
    """Granite 3.3's template renders no calls; its system prompt says to answer "with
    <|tool_call|> followed by a JSON list": that list is read, in every chunking."""
    chat = template("ibm-granite-granite-3.3-2B-Instruct.jinja")
    syntax = tool_syntax(chat)
    assert syntax is not None and (syntax.family, syntax.trigger) == ("granite", "<|tool_call|>")
    shown = chat.render([{"role": "user", "content": "Weather?"}], variables={"tools": [WEATHER]})
    assert "<|tool_call|> followed by a JSON list" in shown and '"get_weather"' in shown
    reply = (
        "Let me look.<|tool_call|>["
        + ", ".join(
            json.dumps({"name": "get_weather", "arguments": a}, ensure_ascii=False) for a in ARGS
        )
        + "]"
    )
    results = {json.dumps(parse(syntax, reply, chunks)) for chunks in chunkings(reply, 3)}
    content, calls = json.loads(results.pop())
    assert not results
    assert content == "Let me look."
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", a) for a in ARGS]


def test_a_template_whose_prompt_opens_the_call_and_names_its_content() -> None:
    """Functionary v3.2: the generation prompt ends with `>>>`, so a reply starts with its
    recipient: `all` and a line break for content, a function's name for a call; later calls
    open with `>>>` again. Its template writes the arguments as text: the history renders
    them as JSON text."""
    chat = template("meetkai-functionary-medium-v3.2.jinja")
    syntax = tool_syntax(chat)
    assert syntax is not None
    assert (syntax.style, syntax.trigger, syntax.name_end) == ("tagged", ">>>", "\n")
    assert (syntax.opened, syntax.content_name) == (True, "all")
    call = json.dumps(ARGS[0], ensure_ascii=False)
    cases = [
        ("all\nHello, world!", "Hello, world!", []),
        (f"get_weather\n{call}", "", [("get_weather", ARGS[0])]),
        (f"all\nLet me look.>>>get_weather\n{call}>>>get_weather\n{call}", "Let me look.", 2),
        ("Hello without a recipient", "Hello without a recipient", []),
    ]
    for text, content, calls in cases:
        want = [("get_weather", ARGS[0])] * calls if isinstance(calls, int) else calls
        results = {json.dumps(parse(syntax, text, chunks)) for chunks in chunkings(text, 9)}
        got_content, got = json.loads(results.pop())
        assert not results
        assert got_content == content
        assert [(n, json.loads(a)) for n, a in got] == want
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS[0]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    shown = chat.render(history, variables={"tools": [WEATHER]})
    assert f">>>get_weather\n{call}" in shown and shown.endswith(">>>")
    # Without tools (or with tool_choice none): the recipient goes, no call is read.
    calling = recipient_only(chat)
    assert calling is not None and recipient_only(template("Qwen3-Coder.jinja")) is None
    for text, content in [("all\nHi", "Hi"), (f"get_weather\n{call}", f"get_weather\n{call}")]:
        parser = calling.parser()
        parser.feed(text)
        parser.finish()
        assert (parser.content, parser.calls) == (content, [])


@pytest.mark.parametrize(
    "name", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"]
)
def test_a_llama_call_may_come_after_its_python_tag(name: str) -> None:
    """Llama 3.x writes its JSON call bare or after `<|python_tag|>` (as vLLM's parser takes
    it); the tag is no content then. Its built-in tools' `name.call(...)` is content, the tag
    with it (llama.cpp of this version parses neither)."""
    syntax = tool_syntax(template(name))
    assert syntax is not None and syntax.lead == "<|python_tag|>"
    call = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    for text in (call, "<|python_tag|>" + call, " <|python_tag|>\n" + call):
        for chunks in chunkings(text, 4):
            assert parse(syntax, text, chunks) == ("", [("get_weather", '{"city": "Oslo"}')])
    assert parse(syntax, "<|python_tag|>x.call(q=1)") == ("<|python_tag|>x.call(q=1)", [])
    assert parse(syntax, "<|python") == ("<|python", [])  # cut there: the text
    assert parse(syntax, "Hi " + call) == ("Hi " + call, [])  # not the whole answer


@pytest.mark.parametrize(
    ("family", "text", "content", "calls"),
    [
        # Whitespace after text after the calls is content, however it comes.
        ("qwen", CALL + "\nDone.\n", "Done.\n", [("get_weather", "{}")]),
        # A string cut at the end, in a region read again after one that broke.
        (
            "qwen",
            '<tool_call>{"arguments":{"x":"a<tool_call>{"name":"get_weather","arguments":{"y":"b',
            '<tool_call>{"arguments":{"x":"a',
            [("get_weather", '{"y":"b')],
        ),
        # Two arguments in one call: not a call.
        (
            "qwen",
            '<tool_call>{"name":"f","arguments":{"x":1}, "arguments": 5}</tool_call>',
            None,
            [],
        ),
        # Llama's tag leads one call; a second tag, or no call after it, is text.
        ("llama", '<|python_tag|><|python_tag|>{"name":"f","parameters":{}}', None, []),
        ("llama", '<|python_tag|>brave_search.call(query="x")', None, []),
    ],
)
def test_every_chunking_reads_alike(
    family: str, text: str, content: str | None, calls: Any
) -> None:
    """Replies whose reading once depended on how they were cut into pieces."""
    syntax = tool_syntax(template(FAMILY_TEMPLATES[family]))
    assert syntax is not None
    for chunks in chunkings(text, 13):
        assert parse(syntax, text, chunks) == (text if content is None else content, calls)


FAMILY_TEMPLATES = {
    "qwen": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "llama": "meta-llama-Llama-3.1-8B-Instruct.jinja",
}


def test_a_template_that_fails_on_text_arguments_too_says_its_own_error() -> None:
    """A render that fails is tried again with the arguments as JSON text (for templates that
    write them as text); when that fails too, the first failure is what is reported."""
    source = (
        "{% for m in messages %}{% if loop.index0 and m.role == loop.previtem.role %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}{% if m.tool_calls %}"
        "{% for k, v in m.tool_calls[0].function.arguments.items() %}{{ k }}{% endfor %}"
        "{% endif %}{% endfor %}"
    )
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "assistant", "content": "y"},
    ]
    with pytest.raises(UsageError, match="roles must alternate"):
        ChatTemplate(source, "file").render(messages)


def test_bad_output_is_content_not_a_call() -> None:
    """An unknown tool, JSON that does not parse: the text as it was, as content; a later
    good call is still found."""
    assert HERMES is not None
    names = frozenset({"get_weather"})
    text = (
        'A <tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call> B '
        "<tool_call>\n{not json}\n</tool_call> C "
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    for chunks in chunkings(text, 3):
        parser = CallParser(HERMES, names)
        for chunk in chunks:
            parser.feed(chunk)
        parser.finish()
        assert [(c.name, c.arguments) for c in parser.calls] == [
            ("get_weather", '{"city": "Oslo"}')
        ]
        assert parser.content == text[: text.rindex("<tool_call>")]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        # Cut inside the arguments: the call as far as it goes (streamed alike).
        (
            'Hi <tool_call>\n{"name": "get_weather", "arguments": {"ci',
            "Hi ",
            [("get_weather", '{"ci')],
        ),
        # Cut before a name was whole, with no call before it: the text is content.
        ('Hi <tool_call>\n{"name": "get_w', 'Hi <tool_call>\n{"name": "get_w', []),
        ("Hi <tool_ca", "Hi <tool_ca", []),
        # ... after a whole call: what was begun goes.
        (CALL + '<tool_call>\n{"name": "get_w', "", [("get_weather", "{}")]),
        (CALL + "<tool_ca", "", [("get_weather", "{}")]),
        (OPEN_CALL + "\n</tool", "", [("get_weather", "{}")]),
        (OPEN_CALL + "\n", "", [("get_weather", "{}")]),
    ],
)
def test_a_reply_cut_inside_a_call_keeps_its_calls(text: str, content: str, calls: Any) -> None:
    """A reply that ends inside a call (at its token limit) keeps the calls there are, the one
    being written as far as it goes, as llama-server's lenient parse has them (the
    side-by-side comparison, scripts/compare_tools.py, cuts its replies at several lengths)."""
    assert HERMES is not None
    for chunks in chunkings(text, 5):
        assert parse(HERMES, text, chunks) == (content, calls)


def test_whitespace_after_the_calls_is_not_content() -> None:
    assert HERMES is not None
    content, calls = parse(HERMES, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\n')
    assert content == "" and calls == [("f", "{}")]


def test_arguments_stream_as_the_model_writes_them() -> None:
    """A long argument arrives in many pieces, before the call ends, and they add up."""
    assert CODER is not None and MISTRAL is not None
    parser = CallParser(MISTRAL)
    fragments = []
    for ch in (
        '[TOOL_CALLS][{"name": "w", "arguments": {"text": "' + "x" * 40 + '"}, "id": "a1b2c3d4e"}]'
    ):
        fragments += [p[1].arguments for p in parser.feed(ch) if p[0] == "call" and p[1].arguments]
    assert len(fragments) > 40
    assert "".join(fragments) == '{"text": "' + "x" * 40 + '"}'
    assert parser.calls[0].id == "a1b2c3d4e"
    content, calls = parse(
        CODER,
        "<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
    )
    assert calls == [("f", '{"n":7}')]


def test_an_xml_string_value_streams_as_the_model_writes_it() -> None:
    """Qwen3-Coder's raw string values (a file's text) are given out as they come, as JSON
    string text; in every chunking they add up to the whole call, whose value loses only the
    newlines next to its tags; other types wait for their end tag; a cut keeps what came."""
    assert CODER is not None
    code = 'print("a\\b")\n\n  x = "<b>" </par'
    text = (
        f"<tool_call>\n<function=write>\n<parameter=text>\n{code}\n</parameter>\n"
        "<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"
    )
    types = {"write": {"text": "string", "n": "integer"}}
    want = json.dumps({"text": code, "n": 7}, ensure_ascii=False, separators=(",", ":"))
    for chunks in chunkings(text, 11):
        parser = CallParser(CODER, value_types=types)
        assembled = Assembled()
        for chunk in chunks:
            for kind, piece in parser.feed(chunk):
                assert kind == "call"
                assembled.add(piece)
        for _, piece in parser.finish():
            assembled.add(piece)
        assert [(c.name, c.arguments) for c in parser.calls] == [("write", want)]
        assert [(c.name, c.arguments) for c in assembled.calls] == [("write", want)]
    one = CallParser(CODER, value_types=types)  # one character at a time, up to the value's
    given = [p[1].arguments for c in text[: text.index("</par")] for p in one.feed(c)]  # "</par"
    assert "".join(given) == '{"text":"print(\\"a\\\\b\\")\\n\\n  x = \\"<b>\\" '
    one.finish()  # cut there: the call as far as it went
    assert one.calls[0].arguments == "".join(given)


PIECES = [
    "<tool_call>",
    "</tool_call>",
    "\n",
    " ",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    '"',
    "\\",
    '"name"',
    '"arguments"',
    '"f"',
    '"g"',
    "1",
    "true",
    "null",
    "abc",
    "é",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<function=",
    ">",
    "</function>",
    "<parameter=",
    "</parameter>",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), max_size=40),
    st.sampled_from(["hermes", "mistral", "coder", "devstral"]),
    st.integers(1, 5),
)
def test_garbled_output_never_breaks_the_parser(pieces: list[str], family: str, step: int) -> None:
    """Any text, in any chunking: no exception, every chunking reads the same, each call has
    a known name and arguments that parse as JSON, and no text is lost or made up."""
    syntax = {"hermes": HERMES, "mistral": MISTRAL, "coder": CODER, "devstral": DEVSTRAL}[family]
    assert syntax is not None
    text = "".join(pieces)
    whole = CallParser(syntax, frozenset({"f", "g"}))
    whole.feed(text)
    whole.finish()
    chunked = [text[i : i + step] for i in range(0, len(text), step)]
    assert parse(syntax, text, chunked)[0] == parse(syntax, text)[0]
    for call in whole.calls:
        assert call.name in ("f", "g")
        json.loads(call.arguments)
    if not whole.calls and not whole.broken:  # (the answer's leading whitespace goes)
        assert whole.content == text.lstrip()


def test_a_call_after_a_dropped_one_streams_under_an_index_of_its_own() -> None:
    assert DEVSTRAL is not None
    parser = CallParser(DEVSTRAL)
    pieces = parser.feed("[TOOL_CALLS]a[ARGS]{oops} [TOOL_CALLS]b[ARGS]{}") + parser.finish()
    names = {p[1].index: p[1].name for p in pieces if p[0] == "call" and p[1].name}
    assert parser.broken and names == {0: "a", 1: "b"}
    assert [c.name for c in parser.calls] == ["b"]
    assert HERMES is not None
    text = (
        '<tool_call>\n{"name": "a", "arguments": {x}\n</tool_call> '
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    )
    for chunks in chunkings(text, 5):
        parser = CallParser(HERMES)
        pieces = [p for chunk in chunks for p in parser.feed(chunk)] + parser.finish()
        names = {p[1].index: p[1].name for p in pieces if p[0] == "call" and p[1].name}
        assert names == {0: "a", 1: "b"}
        assert [c.name for c in parser.calls] == ["b"]
        assert parser.content == text[: text.rindex("<tool_call>")]
