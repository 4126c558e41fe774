"""A grammar for a reply's tool calls, in the family's own syntax (`toolcalls.CallSyntax`).

Each tool's arguments are held to its JSON schema (llama.cpp's schema-to-grammar, with the
limits in `limits`); the markers around them are the template's. The grammar starts at the text
that opens the calls (the trigger), so it can wait, lazily, until the model writes that text
(`tool_choice` "auto"), or hold the whole reply (`required`). After the calls only the end of
the reply may follow, as in llama-server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from localfab.engine.callsyntax import CallSyntax
from localfab.engine.grammar.convert import GrammarRules
from localfab.engine.grammar.limits import GrammarLimitError, check_grammar, check_schema
from localfab.errors import UsageError

Tool = tuple[str, Mapping[str, Any]]  # a function's name and its parameters' JSON schema


# Whitespace between markers: the newline templates put there.
WS_RULE = r"[ \t\n]?"


def _lit(converter: GrammarRules, text: str) -> str:
    """`text` as a grammar literal, optional whitespace after it (and so between markers)."""
    text = text.strip() or text.strip(" \t")  # a line break alone is a marker
    if not text:
        return ""
    # A marker that ends in `=` or a quote runs straight into what follows (`<function=NAME`).
    return _quote(converter, text) + ("" if text[-1] in '="' else " ws")


def _quote(converter: GrammarRules, text: str) -> str:
    return converter.literal(text)


def _seq(*parts: str) -> str:
    """Grammar elements in a row, without two optional whitespaces next to each other."""
    words: list[str] = []
    for part in parts:
        for word in part.split(" "):
            if word and not (word == "ws" and words and words[-1] == "ws"):
                words.append(word)
    return " ".join(words)


def _args_rule(converter: GrammarRules, name: str, schema: Mapping[str, Any]) -> str:
    try:
        check_schema(dict(schema))
        return converter.schema(dict(schema), f"{name}-args")
    except GrammarLimitError:
        raise
    except RecursionError:
        raise UsageError(f"the parameters of tool {name!r} are nested too deeply") from None
    except Exception as exc:  # the converter raises bare ValueError/KeyError/TypeError
        raise UsageError(
            f"the parameters of tool {name!r} cannot be turned into a grammar: {exc}"
        ) from None


def _class_char(c: str) -> str:
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or ("\\" + c if c in "]-\\^[" else c)


def _text_without(converter: GrammarRules, end: str) -> str:
    """A rule for raw text that does not hold `end` (a value's end tag, such as
    `</parameter>`): each character either cannot begin it, or begins it and is followed by
    one that breaks it off (or begins it anew). So a value may hold `</div>`, and only the end
    tag ends it. (Where the tag's first character comes again inside it, the simpler "no `<`
    and its next character" rule.)"""
    first = end[0]
    if len(end) < 2:
        return converter.rule("xml-text", f"[^{_class_char(first)}]*")
    if first in end[1:]:
        rule = f"([^{_class_char(first)}] | {_quote(converter, first)} [^{_class_char(end[1])}])*"
        return converter.rule("xml-text", rule)
    names = [f"xml-text-{k}" for k in range(len(end))]
    restart = f"{_quote(converter, first)} {names[1]}"
    for k in range(len(end) - 1, 0, -1):
        alts = [f"[^{_class_char(end[k])}{_class_char(first)}]", restart]
        if k + 1 < len(end):
            alts.append(f"{_quote(converter, end[k])} {names[k + 1]}")
        converter.rule(names[k], " | ".join(alts))
    return converter.rule("xml-text", f"([^{_class_char(first)}] | {restart})*")


def _xml_args(converter: GrammarRules, s: CallSyntax, name: str, schema: Mapping[str, Any]) -> str:
    """One tag pair per argument: strings as raw text up to the value's end tag, other
    types as JSON."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    until = _text_without(converter, s.value_end.strip())
    fmt = converter.literal
    required = set(schema.get("required") or ())
    pairs = []
    for key, sub in (props or {}).items():
        if not isinstance(sub, Mapping):
            continue
        if sub.get("type") == "string" and isinstance(sub.get("enum"), list):
            value = "(" + " | ".join(fmt(str(v)) for v in sub["enum"]) + ")"
        elif sub.get("type") == "string":  # raw text, its newlines included
            value = until
        else:
            value = f"ws {_args_rule(converter, f'{name}-{key}', sub)} ws"
        pair = _seq(
            "ws",
            fmt(s.key_start.strip()),
            fmt(key),
            fmt(s.key_end.strip()),
            value,
            fmt(s.value_end.strip()),
        )
        # In the schema's order; the required ones must be there.
        rule = converter.rule(f"{name}-{key}-param", pair)
        pairs.append(rule if key in required else f"{rule}?")
    return _seq(*pairs, "ws") if pairs else "ws"


def _call_rule(converter: GrammarRules, s: CallSyntax, name: str, schema: Mapping[str, Any]) -> str:
    fmt = converter.literal
    # An id the model writes, where the template has one: as many characters as it takes.
    call_id = f"[a-zA-Z0-9]{{{s.id_chars}}}" if s.id_chars else "[a-zA-Z0-9]{1,40}"
    if s.style == "json":
        args = _args_rule(converter, name, schema)
        written_id = (
            f'space "," space {fmt(json.dumps(s.id_key))} space ":" space "\\"" {call_id} "\\""'
            if s.id_key and s.id_chars
            else ""
        )
        body = (
            f'"{{" space {fmt(json.dumps(s.name_key))} space ":" space {fmt(json.dumps(name))} '
            f'space "," space {fmt(json.dumps(s.args_key))} space ":" space {args} '
            f'{written_id} space "}}" ws'
        )
    elif s.style == "tagged":
        body = _seq(
            fmt(name),
            f"{fmt(s.id_start.strip())} {call_id}" if s.id_start.strip() else "",
            _lit(converter, s.name_end),
            _args_rule(converter, name, schema),
            "ws",
        )
    else:
        body = _seq(fmt(name), fmt(s.name_end.strip()), _xml_args(converter, s, name, schema))
    return converter.rule(f"call-{name}", body)


def tool_call_grammar(
    syntax: CallSyntax, tools: Sequence[Tool], *, parallel: bool = True, opened: bool = False
) -> str:
    """GBNF for one or more calls (one when not `parallel`) of `tools`, from the trigger on
    (`opened`: from just after it, where the prompt wrote it: Functionary v3.2's `>>>`)."""
    if not tools:
        raise UsageError("a tool-call grammar needs at least one tool")
    converter = GrammarRules()
    converter.rule("ws", WS_RULE)
    calls = " | ".join(_call_rule(converter, syntax, name, schema) for name, schema in tools)
    call = converter.rule("call", calls)
    s = syntax
    if s.style == "json" and s.array:
        more = f'("," ws {call})*' if parallel else ""
        body = _seq('"["', "ws", call, more, '"]"', "ws")
    else:
        one = converter.rule(
            "one-call", _seq(_lit(converter, s.call_start), call, _lit(converter, s.call_end))
        )
        body = f"{one}+" if parallel else one
        if opened:  # the prompt wrote the first call's opening
            first = _seq(call, _lit(converter, s.call_end))
            body = _seq(first, f"{one}*") if parallel else first
    root = _seq(_lit(converter, s.section_start), body, _lit(converter, s.section_end))
    converter.rule("root", root)
    grammar = converter.grammar()
    try:
        check_grammar(grammar)
    except GrammarLimitError as exc:
        raise GrammarLimitError(f"the grammar made from the tools is too large: {exc}") from None
    return grammar


def trigger_patterns(syntax: CallSyntax, after: str = "") -> tuple[str, ...]:
    """The lazy grammar's triggers: the calls' opening text (llama.cpp's trigger word), or,
    with `after` (a reasoning block's end tag), the first text after it (the grammar then holds
    the whole answer)."""
    if after:
        return (re.escape(after) + r"\s*(\S)",)
    return (re.escape(syntax.trigger),) if syntax.trigger else ()
