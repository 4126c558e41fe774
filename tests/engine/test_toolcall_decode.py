"""Tool calls in the token step on the real model: the grammar holds a call to the tool's schema
in each family's own syntax, the calls stream as the reply does, a call written while thinking is
a thought, and speculative decoding finds the same calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localfab.chat.tools import ToolRequest, plan_tools
from localfab.chat.toolsyntax import GENERIC, tool_syntax
from localfab.engine import Done, GenerationOptions, SamplingParams, TokenEvent
from localfab.engine.grammar.tools import tool_call_grammar, trigger_patterns
from localfab.engine.reasoning import Thinking
from localfab.engine.toolcalls import ToolCalling
from tests.engine.assembled import Assembled
from tests.engine.test_spec import NGRAM, REWRITE
from tests.engine.test_toolcalls import FAMILIES, WEATHER, template

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Lima"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "days"],
}
TOOL = [("get_weather", SCHEMA)]


def run(engine: Any, prompt: list[int], opts: GenerationOptions) -> tuple[str, Assembled, Done]:
    """The content and the calls as the events carried them, and the Done."""
    content, calls, done = "", Assembled(), None
    for event in engine.stream(prompt, opts):
        if isinstance(event, TokenEvent):
            content += "".join(t for k, t in event.parts or () if k == "content")
            for delta in event.calls:
                calls.add(delta)
        else:
            done = event
    assert done is not None
    return content, calls, done


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_grammar_holds_a_call_to_the_schema_in_each_familys_syntax(
    engine: Any, name: str
) -> None:
    """`tool_choice: required`: whatever the (base) model would write, the reply is a call in
    the family's syntax whose arguments fit the schema, and the stream adds up to it."""
    syntax = tool_syntax(template(name))
    assert syntax is not None
    grammar = tool_call_grammar(syntax, TOOL, parallel=False)
    calling = ToolCalling(
        syntax,
        frozenset({"get_weather"}),
        (("get_weather", (("city", "string"), ("days", "integer"))),),
        parallel=False,
    )
    opts = GenerationOptions(
        max_tokens=160, sampling=SamplingParams(temperature=0, grammar=grammar), tools=calling
    )
    engine.clear_cache()
    content, calls, done = run(engine, engine.tokenize("The weather in Oslo for 3 days:"), opts)
    assert done.tool_calls is not None and len(done.tool_calls) == 1, done.text
    call = done.tool_calls[0]
    args = json.loads(call.arguments)
    assert call.name == "get_weather" and args["city"] in ("Oslo", "Lima")
    assert isinstance(args["days"], int)
    assert [(c.name, c.arguments) for c in calls.calls] == [(call.name, call.arguments)]
    assert content == done.content == ""
    assert done.stop_type == "eos"  # the grammar ends the reply after the call


def test_a_lazy_grammar_waits_for_the_marker_then_holds_the_call(engine: Any) -> None:
    """`auto` on the test model's template, which knows no tools (the generic syntax): the
    model writes text, then `<tool_call>`, and from there the grammar decides."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.tools import tool_messages

    builder = PromptBuilder(engine)
    asked = ToolRequest((WEATHER,), parallel=False)
    messages = tool_messages(
        builder.template, [{"role": "user", "content": "Weather in Oslo?"}], asked
    )
    plan = plan_tools(asked, builder.template)
    assert plan.generic and plan.triggers == trigger_patterns(GENERIC)
    sampling = SamplingParams(temperature=0, grammar=plan.grammar, grammar_triggers=plan.triggers)
    engine.clear_cache()
    content, calls, done = run(
        engine,
        builder.tokens(messages),
        GenerationOptions(max_tokens=80, sampling=sampling, tools=plan.calling),
    )
    assert done.tool_calls and done.tool_calls[0].name == "get_weather"
    assert "city" in json.loads(done.tool_calls[0].arguments)
    assert content == done.content and "<tool_call>" not in content
    assert done.text.index("<tool_call>") > 0  # text came first, unconstrained


def test_a_prompt_that_opens_the_call_gets_a_grammar_from_the_name_on(engine: Any) -> None:
    """Functionary v3.2's generation prompt ends with `>>>`: the reply starts with a
    recipient. With `required` the grammar holds the whole reply from the name on; the calls
    parse."""
    chat = template("meetkai-functionary-medium-v3.2.jinja")
    asked = ToolRequest((WEATHER,), choice="required")
    plan = plan_tools(asked, chat)
    assert plan.calling.syntax.opened and not plan.triggers
    prompt = chat.render(
        [{"role": "user", "content": "Weather in Oslo?"}], variables={"tools": [WEATHER]}
    )
    assert prompt.endswith(">>>")
    sampling = SamplingParams(temperature=0, grammar=plan.grammar)
    engine.clear_cache()
    content, calls, done = run(
        engine,
        engine.tokenize(prompt),
        GenerationOptions(max_tokens=120, sampling=sampling, tools=plan.calling),
    )
    assert done.tool_calls and done.tool_calls[0].name == "get_weather", done.text
    assert done.text.startswith("get_weather\n")
    assert "city" in json.loads(done.tool_calls[0].arguments)
    assert content == done.content == ""
    assert [c.arguments for c in calls.calls] == [c.arguments for c in done.tool_calls]


def grammar_takes(engine: Any, grammar: str, text: str) -> bool:
    """Whether `grammar` lets the model write `text` (token by token, as it would)."""
    from localfab.engine.sampling import GuardedSampler

    sampler = GuardedSampler(
        engine.vocab, engine.n_vocab, engine.n_ctx, SamplingParams(grammar=grammar), {}
    )
    try:
        for tok in engine.tokenize(text, add_special=False, parse_special=False):
            if not sampler.allows(tok):
                return False
            sampler.accept(tok)
        return True
    finally:
        sampler.close()


def test_a_raw_string_argument_may_hold_any_end_tag_but_its_own(engine: Any) -> None:
    """Qwen3-Coder writes a file's text raw between `<parameter=...>` tags: under the grammar
    it may hold `</div>`, `</p`, `<<` and every beginning of `</parameter>`; the end tag itself
    ends the value."""
    syntax = tool_syntax(template("Qwen3-Coder.jinja"))
    assert syntax is not None
    write = [("write", {"type": "object", "properties": {"text": {"type": "string"}}})]
    grammar = tool_call_grammar(syntax, write, parallel=False)

    def reply(value: str) -> str:
        return (
            f"<tool_call>\n<function=write>\n<parameter=text>\n{value}\n</parameter>\n"
            "</function>\n</tool_call>"
        )

    html = '<div class="a">x</div>\n<</p </par </parameter- <a/>'
    assert grammar_takes(engine, grammar, reply(html))
    assert grammar_takes(engine, grammar, reply(""))
    assert not grammar_takes(engine, grammar, reply("a</parameter>b"))


HERMES_FORCED = (
    '<think>I could call <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> now.</think>'
    'Calling. <tool_call>\n{"name": "g", "arguments": {"x": 1}}\n</tool_call>'
)


def test_a_call_written_while_thinking_is_a_thought(engine: Any) -> None:
    syntax = tool_syntax(template("Qwen-Qwen3-0.6B.jinja"))
    assert syntax is not None
    forced = "root ::= " + json.dumps(HERMES_FORCED)
    opts = GenerationOptions(
        max_tokens=120,
        sampling=SamplingParams(temperature=0, grammar=forced),
        thinking=Thinking("<think>", "</think>"),
        tools=ToolCalling(syntax),
    )
    engine.clear_cache()
    content, calls, done = run(engine, engine.tokenize("Go:"), opts)
    assert done.text == HERMES_FORCED
    assert done.reasoning is not None and '"name": "f"' in done.reasoning
    assert [(c.name, c.arguments) for c in done.tool_calls or ()] == [("g", '{"x": 1}')]
    assert content == done.content == "Calling. "


def test_speculative_decoding_finds_the_same_calls(engine: Any) -> None:
    """Prompt lookup drafts the rewrite; the calls are the same with and without it."""
    syntax = tool_syntax(template("Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert syntax is not None
    opts = GenerationOptions(
        max_tokens=80,
        sampling=SamplingParams(temperature=0, ignore_eos=True),
        tools=ToolCalling(syntax),
    )
    text = (
        'Say <tool_call>\n{"name": "say", "arguments": {"text": "Thomas went home."}}\n</tool_call>'
    )
    prompt = engine.tokenize(REWRITE.replace("Thomas", text, 1))
    engine.clear_cache()
    plain = run(engine, prompt, opts)
    engine.set_speculation(NGRAM)
    try:
        engine.clear_cache()
        fast = run(engine, prompt, opts)
    finally:
        engine.set_speculation(None)
    assert fast[2].tokens == plain[2].tokens
    assert fast[2].tool_calls == plain[2].tool_calls and fast[0] == plain[0]
    assert fast[2].timings.draft_n_accepted > 0
