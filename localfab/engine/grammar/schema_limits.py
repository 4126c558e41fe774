"""Limits on JSON schemas, checked before llama-cpp-python's converter turns one into a grammar.

The converter turns `maxLength: N` into N nested groups and builds the whole string first, and
every `enum` value is an alternative; `check_schema` bounds those, the document's size and depth,
`pattern`s and `$ref`s in one pass, with an estimate of the grammar's size.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from localfab.engine.grammar.bounds import (
    SCHEMA_MAX_DEPTH,
    SCHEMA_MAX_ENUM,
    SCHEMA_MAX_ESTIMATE,
    SCHEMA_MAX_NODES,
    SCHEMA_MAX_PATTERN,
    SCHEMA_MAX_REPETITION,
    GrammarLimitError,
    bound,
    too,
)

_REPETITION_KEYS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)


_REP_BOUNDS = re.compile(r"\{\s*(\d*)\s*(?:(,)\s*(\d*)\s*)?\}")

_PATTERN_TOKEN = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|[()|*+?]|.", re.DOTALL)


def _pattern_estimate(pattern: str, where: str) -> int:
    """Characters of grammar a regex `pattern` turns into: repetitions of groups multiply."""
    if len(pattern) > SCHEMA_MAX_PATTERN:
        raise too(
            f"{where}: pattern length", len(pattern), SCHEMA_MAX_PATTERN, "use a shorter pattern"
        )
    hint = "use a smaller repetition count or `*`/`+`"
    stack: list[int] = []
    current = last = 0
    for m in _PATTERN_TOKEN.finditer(pattern):
        tok = m.group()
        if tok == "(":
            stack.append(current)
            current = last = 0
        elif tok == ")":
            inner = current
            current = stack.pop() if stack else 0
            last = inner + 4
            current += last
        elif tok.startswith("{") and len(tok) > 1:
            bounds = _REP_BOUNDS.fullmatch(tok)
            if bounds is None:
                continue
            what = f"{where}: pattern repetition count"
            lo = bound(bounds.group(1) or "0", what, SCHEMA_MAX_REPETITION, hint)
            hi = (
                bound(bounds.group(3), what, SCHEMA_MAX_REPETITION, hint)
                if bounds.group(3)
                else lo + 1
            )
            added = last * max(lo, hi)
            current += added
        elif tok in ("*", "+", "?"):
            current += 2
        elif tok == "|":
            current += 3
        else:
            last = len(tok) + 2
            current += last
        if current > SCHEMA_MAX_ESTIMATE:
            raise too(
                f"{where}: estimated grammar size of the pattern",
                f"{current} bytes",
                SCHEMA_MAX_ESTIMATE,
                "use a simpler pattern",
            )
    return current + sum(stack)


# (node, depth, path for messages, length of the rule name the converter gives it)
_SchemaItem = tuple[Any, int, str, int]


def _check_walk(nodes: int, depth: int) -> None:
    if nodes > SCHEMA_MAX_NODES:
        raise too(
            "json_schema node count",
            f"over {SCHEMA_MAX_NODES}",
            SCHEMA_MAX_NODES,
            "use a smaller schema",
        )
    if depth > SCHEMA_MAX_DEPTH:
        raise too(
            "json_schema nesting depth",
            f"over {SCHEMA_MAX_DEPTH}",
            SCHEMA_MAX_DEPTH,
            "flatten the schema or use $defs",
        )


def _repetition_estimate(node: dict[Any, Any], where: str, rule_len: int) -> int:
    """Grammar bytes the repetition bounds of one schema object turn into."""
    # A string repeats the `char` rule; an array its item rule, named after the property
    # path; either way with a separator and brackets around each repetition.
    item_len = {"Length": 10, "Items": rule_len + 16, "Properties": rule_len + 32}
    estimate = 0
    for key in _REPETITION_KEYS:
        value = node.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value) or value > SCHEMA_MAX_REPETITION:
            shown = int(value) if math.isfinite(value) and value == int(value) else value
            raise too(
                f"{where} {key}", shown, SCHEMA_MAX_REPETITION, f"lower {key} or leave it out"
            )
        if value > 0:
            estimate += int(value) * item_len.get(key[3:], rule_len + 16)
    return estimate


def _enum_count(node: dict[Any, Any]) -> int:
    """Alternatives the `enum` and `const` of one schema object add."""
    count = 0
    for key in ("enum", "const"):
        if key in node:
            values = node[key] if key == "enum" and isinstance(node[key], list) else [node[key]]
            count += len(values)
    return count


def _check_object(node: dict[Any, Any], where: str) -> None:
    """Checks of one schema object that add to no total: `$ref`."""
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise GrammarLimitError(
            f"{where}: $ref {ref[:100]!r} is not supported; only references into the same "
            "schema (starting with '#') are"
        )


def _children(node: dict[Any, Any], depth: int, path: str, rule_len: int) -> list[_SchemaItem]:
    children: list[_SchemaItem] = []
    for key, value in node.items():
        if isinstance(value, dict | list):
            name = key if isinstance(key, str) else ""
            child = f"{path}.{name}" if len(path) < 1000 else path
            # A property's rule is named after its path; other nodes add a suffix.
            grow = len(name) + 1 if path.endswith(".properties") else 5
            children.append((value, depth + 1, child, rule_len + grow))
    return children


def _check_estimate(estimate: int, shown: str) -> None:
    if estimate > SCHEMA_MAX_ESTIMATE:
        raise too(
            "json_schema estimated grammar size",
            shown,
            SCHEMA_MAX_ESTIMATE,
            "use smaller repetition bounds or a smaller schema",
        )


def check_schema(schema: Any) -> None:
    """Raise GrammarLimitError when turning `schema` into a grammar would be too costly.

    One pass over the document with an explicit stack: node count, nesting depth, repetition
    bounds, enum sizes, patterns, local-only `$ref`, and an estimate of the grammar's size.
    """
    estimate = 0
    nodes = 0
    enums = 0
    stack: list[_SchemaItem] = [(schema, 1, "", 4)]
    while stack:
        node, depth, path, rule_len = stack.pop()
        if not isinstance(node, dict | list):
            continue
        nodes += 1
        _check_walk(nodes, depth)
        if isinstance(node, list):
            stack.extend((item, depth + 1, path, rule_len + 4) for item in node)
            continue
        where = f"json_schema{path or ''}"
        estimate += _repetition_estimate(node, where, rule_len)
        enums += _enum_count(node)
        if enums > SCHEMA_MAX_ENUM:
            raise too(
                "json_schema enum values",
                f"over {SCHEMA_MAX_ENUM}",
                SCHEMA_MAX_ENUM,
                "use fewer enum values",
            )
        _check_object(node, where)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            estimate += _pattern_estimate(pattern, where)
        _check_estimate(estimate, f"over {SCHEMA_MAX_ESTIMATE} bytes")
        stack.extend(_children(node, depth, path, rule_len))
    # Literals (enum values, property names, descriptions are not in the grammar) are at most
    # the document's own size; the walk above bounded that document.
    size = len(json.dumps(schema, ensure_ascii=False))
    _check_estimate(estimate + size, f"{estimate + size} bytes")
