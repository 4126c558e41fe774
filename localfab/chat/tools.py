"""A chat request's tools: checked as llama-server checks them, shown to the model (by its
template, or in a system message where the template does not), and turned into what the token
step needs: the parser for the family's calls and the grammar that holds them to the tools'
schemas (see `toolsyntax` for how a template's call syntax is found).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from localfab.chat.templates import ChatTemplate
from localfab.chat.toolsyntax import GENERIC, GENERIC_PROMPT, shows_tools, tool_syntax
from localfab.engine.callsyntax import MAX_NAME
from localfab.engine.grammar.tools import tool_call_grammar, trigger_patterns
from localfab.engine.loosecalls import LooseCalls
from localfab.engine.toolcalls import ToolCalling
from localfab.errors import UsageError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A dataclass with `sampling` (SamplingParams) and `tools` fields.
_Opts = TypeVar("_Opts", bound="DataclassInstance")


def describe_tools(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], *, how: bool = True
) -> list[dict[str, Any]]:
    """The messages with the tools described in the system message: with `how`, `GENERIC`'s
    prompt (how to call them, for a template that knows no calls); without, only the tools
    (for a template that writes calls but not the tools)."""
    head = GENERIC_PROMPT if how else "You can call these tools:\n"
    text = head + json.dumps(list(tools), ensure_ascii=False, indent=2)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{text}".lstrip()
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


Choice = Literal["auto", "none", "required"]


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools, checked: the definitions (OpenAI's shape, as sent), the choice
    (`auto`, `none`, `required`; a named function is `required` of that one tool), and whether
    a reply may make several calls."""

    tools: tuple[dict[str, Any], ...]
    choice: Choice = "auto"
    named: str | None = None
    parallel: bool = True

    @property
    def functions(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, parameters schema) of the tools a reply may call."""
        out = []
        for tool in self.tools:
            function = tool["function"]
            if self.named is None or function["name"] == self.named:
                out.append((function["name"], function.get("parameters") or {}))
        return out


def parse_tools(tools: Any, choice: Any = None, parallel: Any = None) -> ToolRequest | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a request (None: no tools); a
    UsageError in llama-server's words for a malformed one."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise UsageError("Failed to parse tools: tools must be an array")
    checked = tuple(_tool(i, t) for i, t in enumerate(tools))
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in checked}:
            raise UsageError(f"Invalid tool_choice: {json.dumps(choice)} names no given tool")
        choice, named = "required", name
    elif choice not in ("auto", "none", "required"):
        raise UsageError(f"Invalid tool_choice: {choice}")
    if parallel is not None and not isinstance(parallel, bool):
        raise UsageError("Field 'parallel_tool_calls' must be a boolean")
    if parallel is None:  # OpenAI's default; a named function is one call of it
        parallel = named is None
    return ToolRequest(checked, choice, named, parallel)


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"Failed to parse tools: tools[{i}]"
    if not isinstance(tool, dict):
        raise UsageError(f"{where} must be an object")
    kind = tool.get("type")
    if kind is None:
        raise UsageError(f"{where}: Missing tool type")
    if kind != "function":
        raise UsageError(f"{where}: Unsupported tool type: {kind}")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UsageError(f"{where}: a function with a name is required")
    name = function["name"]
    if not name or len(name) > MAX_NAME or any(c.isspace() for c in name):
        raise UsageError(f"{where}: {name!r} is not a function name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise UsageError(f"{where}: parameters must be a JSON schema object")
    return {"type": "function", "function": {**function, "parameters": parameters or {}}}


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools are served: the messages as the template gets them, what the
    token step parses, and the grammar (None: unconstrained) with its triggers (lazy)."""

    calling: ToolCalling
    grammar: str | None
    triggers: tuple[str, ...]
    generic: bool  # the template knows no tools: they are described in a system message

    def onto(self, options: _Opts) -> _Opts:
        """`options` (the engine's GenerationOptions, or the server's Generation) with this
        plan: its parser, and its grammar (lazy: with its triggers) where it has one."""
        sampling = options.sampling  # type: ignore[attr-defined]
        if self.grammar is not None:
            sampling = replace(sampling, grammar=self.grammar, grammar_triggers=self.triggers)
        return replace(options, sampling=sampling, tools=self.calling)


def plan_tools(
    request: ToolRequest, template: ChatTemplate, thinking_end: str = "", *, lenient: bool = False
) -> ToolPlan:
    """The parser and grammar for `request` on `template`. `thinking_end`: the closing tag of
    a reasoning block the reply starts in or may open; with `required` the grammar then waits
    until it (the reply thinks first). `lenient`: a reply that is only a bare JSON call of an
    offered tool is a call too (`engine.loosecalls`), as small models write them."""
    syntax = tool_syntax(template)
    generic = syntax is None
    syntax = syntax or GENERIC
    functions = request.functions
    parallel = request.parallel and syntax.parallel
    calling = ToolCalling(
        syntax,
        frozenset(name for name, _ in functions),
        tuple((name, _value_types(schema)) for name, schema in functions),
        parallel=parallel,
        grammar_in_reasoning=request.choice == "required" and bool(thinking_end),
        loose=LooseCalls.of(functions, name_key=syntax.name_key, args_key=syntax.args_key)
        if lenient
        else None,
    )
    if request.choice == "none" or not syntax.trigger and request.choice == "auto":
        return ToolPlan(calling, None, (), generic)
    whole = request.choice != "auto"  # the grammar holds the whole answer, not from a trigger
    grammar = tool_call_grammar(
        syntax, functions, parallel=parallel, opened=whole and syntax.opened
    )
    triggers: tuple[str, ...] = ()
    if request.choice == "auto":
        triggers = trigger_patterns(syntax)
    elif thinking_end:
        triggers = trigger_patterns(syntax, after=thinking_end)
    return ToolPlan(calling, grammar, triggers, generic)


def recipient_only(template: ChatTemplate) -> ToolCalling | None:
    """For a reply without tools (or with `tool_choice` none) on a template whose prompt opens
    the call and that names its content (Functionary v3.2's `>>>` then `all`): a parser that
    takes that name off the content and reads no calls. None for other templates."""
    syntax = tool_syntax(template)
    if syntax is None or not (syntax.opened and syntax.content_name):
        return None
    return ToolCalling(syntax, frozenset())


def _value_types(schema: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return ()
    return tuple(
        (key, str(sub.get("type")))
        for key, sub in props.items()
        if isinstance(sub, Mapping) and isinstance(sub.get("type"), str)
    )


def tool_messages(
    template: ChatTemplate, messages: Sequence[Mapping[str, Any]], tools: ToolRequest
) -> list[dict[str, Any]]:
    """The messages a request with tools is rendered from: as they are where the template
    shows the tools (they go in its `tools`), with the tools described in the system message
    where it does not (and how to call them where it writes no calls either)."""
    if tool_syntax(template) is None:
        return describe_tools(messages, tools.tools)
    if not shows_tools(template):
        return describe_tools(messages, tools.tools, how=False)
    return [dict(m) for m in messages]


def tool_caps(template: ChatTemplate) -> dict[str, Any]:
    """What `/props` says of tool calling with `template`: llama-server's capabilities
    (`supports_tools`, `supports_tool_calls`, `supports_parallel_tool_calls`), and how calls
    are written (`tool_call_format`: "template", or "generic" where the template writes none
    and the tools are described in a system message) and opened (`tool_call_trigger`)."""
    syntax = tool_syntax(template)
    return {
        "supports_tools": shows_tools(template),
        "supports_tool_calls": syntax is not None,
        "supports_parallel_tool_calls": syntax is not None and syntax.parallel,
        "tool_call_format": "generic" if syntax is None else "template",
        "tool_call_trigger": (syntax or GENERIC).trigger,
    }


def tools_tokens(
    tools: Sequence[Mapping[str, Any]], tokenize: Callable[[str], list[int]], room: int
) -> tuple[int, bool]:
    """About how many tokens `tools` take as a template shows them (their JSON), measured
    cheaply against `room`: (tokens, whether that is the exact count). A text of no more
    bytes than `room` fits (a token is at least a byte) and is not tokenized; the start of a
    long one is tokenized first, and where that alone is more than `room` the whole is only
    estimated from it; else the whole is tokenized once. A few calls in all, however many
    tools (each could be a request to a remote server's tokenizer)."""
    text = json.dumps(list(tools), ensure_ascii=False)
    size = len(text.encode())
    if size <= room:
        return size, False
    head = text[: max(room, 1) * 16]  # a token of more than 16 characters is rare in JSON
    tokens = len(tokenize(head))
    if len(head) == len(text):
        return tokens, True
    if tokens > room:
        return tokens * len(text) // len(head), False
    return len(tokenize(text)), True
