"""JSON grammars for constrained output (`response_format`, `json_schema`).

llama-cpp-python ships the same JSON-schema-to-GBNF converter as llama.cpp's own
`json_schema_to_grammar`; this wrapper keeps the `llama_cpp` import inside the engine package.
"""

from __future__ import annotations

import json
from typing import Any

from localfab.engine.grammar.limits import GrammarLimitError, check_grammar, check_schema
from localfab.errors import UsageError


def _module() -> Any:
    from llama_cpp import llama_grammar

    return llama_grammar


def schema_converter() -> Any:
    """A fresh instance of llama.cpp's JSON-schema-to-grammar converter (its SchemaConverter),
    for grammars built from schemas and more (tool calls)."""
    return _module().SchemaConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )


class GrammarRules:
    """llama.cpp's JSON-schema-to-grammar converter as grammars built around schemas use it
    (tool calls): literals, named rules (made unique as the converter makes its own), a
    schema's rule, and the whole grammar. The literal and rule helpers are private in
    llama-cpp-python (its version is pinned): they are read here only."""

    def __init__(self) -> None:
        self._converter = schema_converter()

    def literal(self, text: str) -> str:
        return str(self._converter._format_literal(text))

    def rule(self, name: str, body: str) -> str:
        return str(self._converter._add_rule(name, body))

    def schema(self, schema: dict[str, Any], name: str) -> str:
        converter = self._converter
        return str(converter.visit(converter.resolve_refs(schema, "tool"), name))

    def grammar(self) -> str:
        return str(self._converter.format_grammar())


def json_gbnf() -> str:
    """GBNF for any JSON value (llama.cpp's `grammars/json.gbnf`)."""
    return str(_module().JSON_GBNF)


def builtin_grammars() -> dict[str, str]:
    """llama.cpp's example grammars (`grammars/*.gbnf`) as llama-cpp-python ships them."""
    module = _module()
    return {
        name.removesuffix("_GBNF").lower(): str(value)
        for name, value in vars(module).items()
        if name.endswith("_GBNF") and isinstance(value, str)
    }


def json_schema_to_gbnf(schema: dict[str, Any]) -> str:
    """GBNF accepting exactly the JSON documents `schema` allows; UsageError if unsupported.

    The schema is checked against the limits in `limits` first (GrammarLimitError), so
    the converter never builds a grammar that is huge or that llama.cpp could not parse.
    """
    check_schema(schema)
    try:
        grammar = str(_module().json_schema_to_gbnf(json.dumps(schema)))
    except RecursionError as exc:
        raise UsageError("the JSON schema is nested too deeply") from exc
    except Exception as exc:  # the converter raises bare ValueError/KeyError/TypeError
        raise UsageError(f"the JSON schema cannot be turned into a grammar: {exc}") from exc
    try:
        check_grammar(grammar)
    except GrammarLimitError as exc:
        raise GrammarLimitError(f"the grammar made from json_schema is too large: {exc}") from None
    return grammar


def __getattr__(name: str) -> Any:
    # JSON_GBNF is loaded lazily so importing this module stays cheap.
    if name == "JSON_GBNF":
        return json_gbnf()
    raise AttributeError(name)
