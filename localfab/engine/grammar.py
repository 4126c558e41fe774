"""JSON grammars for constrained output (`response_format`, `json_schema`).

llama-cpp-python ships the same JSON-schema-to-GBNF converter as llama.cpp's own
`json_schema_to_grammar`; this wrapper keeps the `llama_cpp` import inside the engine package.
"""

from __future__ import annotations

import json
from typing import Any

from localfab.errors import UsageError


def _module() -> Any:
    from llama_cpp import llama_grammar

    return llama_grammar


def json_gbnf() -> str:
    """GBNF for any JSON value (llama.cpp's `grammars/json.gbnf`)."""
    return str(_module().JSON_GBNF)


def json_schema_to_gbnf(schema: dict[str, Any]) -> str:
    """GBNF accepting exactly the JSON documents `schema` allows; UsageError if unsupported."""
    try:
        return str(_module().json_schema_to_gbnf(json.dumps(schema)))
    except RecursionError as exc:
        raise UsageError("the JSON schema is nested too deeply") from exc
    except Exception as exc:  # the converter raises bare ValueError/KeyError/TypeError
        raise UsageError(f"the JSON schema cannot be turned into a grammar: {exc}") from exc


def __getattr__(name: str) -> Any:
    # JSON_GBNF is loaded lazily so importing this module stays cheap.
    if name == "JSON_GBNF":
        return json_gbnf()
    raise AttributeError(name)
