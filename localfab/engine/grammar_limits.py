"""Limits on GBNF grammars and JSON schemas, checked before llama.cpp or the converter sees them.

llama.cpp's grammar parser recurses once per nested group (100k nested parentheses overflow
the stack), copies a repeated element once per repetition (`"x"{0,1000000}`), and its sampler
keeps one parse stack per alternative that can start here, each compared against the whole
vocabulary on every token. llama-cpp-python's JSON-schema converter turns `maxLength: N` into N
nested groups and builds the whole string first. A request past any of these limits gets a 400
that names the limit instead of a crashed or frozen server.

The limits leave room for every grammar in llama.cpp's `grammars/` folder and for typical
structured-output schemas. The checks are single linear passes over input bounded in size.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from localfab.errors import UsageError

# --- the limits (one place) --------------------------------------------------------------------

GRAMMAR_MAX_BYTES = 256 * 1024  # GBNF text, UTF-8; llama.cpp's largest own grammar is ~5 KB
GRAMMAR_MAX_NESTING = 1024  # nested ( ) groups; the parser recurses once per level
# `name ::=` definitions plus ( ) groups (each becomes a rule); chains of 20000 rules that each
# start with the next one still parse and sample on a worker thread's stack.
GRAMMAR_MAX_RULES = 20_000
# `|` in the whole grammar. Each alternative that can start at the current position is a parse
# stack llama.cpp compares with the whole vocabulary on every token: 2000 cost seconds a token.
GRAMMAR_MAX_ALTERNATIVES = 2000
GRAMMAR_MAX_REPETITION = 1000  # m and n in `x{m,n}`; llama.cpp copies x that many times
# m and n in `(...){m,n}` / `rule{m,n}`: copies of a part that can match nothing make llama.cpp's
# parse stacks grow polynomially (`("a"?){0,100}` takes seconds a token, {0,300} minutes).
GRAMMAR_MAX_GROUP_REPETITION = 32
# Grammar elements once every x{m,n} is expanded, nested repetitions multiplied: llama.cpp
# copies x, and each copy of a part that may match nothing is another parse stack per token.
GRAMMAR_MAX_EXPANDED = 100_000

SCHEMA_MAX_NODES = 20_000  # objects and arrays in the schema document
SCHEMA_MAX_DEPTH = 64  # nested objects/arrays in the schema document
SCHEMA_MAX_REPETITION = 1000  # minLength/maxLength/minItems/maxItems/min-maxProperties
SCHEMA_MAX_ENUM = 1000  # values across all `enum`s (OpenAI's own limit): each is an alternative
SCHEMA_MAX_PATTERN = 2000  # characters in one `pattern`
SCHEMA_MAX_ESTIMATE = GRAMMAR_MAX_BYTES  # estimated size of the grammar the schema turns into

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


class GrammarLimitError(UsageError):
    """A grammar or JSON schema past one of the limits above; the message names the limit."""


class GrammarDeadEnd(UsageError):
    """The grammar (with logit_bias / ignore_eos) lets no token continue the reply."""


def _too(what: str, value: int | float | str, limit: int, hint: str) -> GrammarLimitError:
    return GrammarLimitError(f"{what} {value} exceeds the limit of {limit}; {hint}")


# --- GBNF ----------------------------------------------------------------------------------------

# One token of GBNF that matters for the limits. Strings, character classes, token references and
# comments are matched whole so that brackets inside them do not count.
_GBNF_TOKEN = re.compile(
    r"""
    (?P<str>"(?:\\.|[^"\\])*"?)
    | (?P<cls>\[(?:\\.|[^\]\\])*\]?)
    | (?P<com>\#[^\n]*)
    | (?P<tok><[^>\n]*>)
    | (?P<rule>::=)
    | (?P<rep>\{[^}]*\}?)
    | (?P<op>[()|*+?])
    | (?P<ref>[A-Za-z0-9_.-]+)
    """,
    re.VERBOSE | re.DOTALL,
)
_REP_BOUNDS = re.compile(r"\{\s*(\d*)\s*(?:(,)\s*(\d*)\s*)?\}")


def _bound(text: str, what: str, limit: int, hint: str) -> int:
    # Long digit strings are rejected by length first: int() of a huge string is itself slow.
    if len(text) > 9 or int(text) > limit:
        raise _too(what, text if len(text) <= 24 else text[:20] + "...", limit, hint)
    return int(text)


def check_grammar(grammar: str) -> None:
    """Raise GrammarLimitError when `grammar` (GBNF) is past a limit; cheap and linear."""
    if len(grammar) > GRAMMAR_MAX_BYTES or len(grammar.encode("utf-8", "replace")) > (
        GRAMMAR_MAX_BYTES
    ):
        raise _too(
            "grammar size",
            f"{len(grammar.encode('utf-8', 'replace'))} bytes",
            GRAMMAR_MAX_BYTES,
            "use a smaller grammar",
        )
    depth = max_depth = 0
    rules = groups = alternatives = 0
    expanded = 0
    stack: list[int] = []  # elements in each open group
    current = 0  # elements in the innermost open sequence
    last = 0  # elements of the atom a following repetition operator applies to
    last_is_group = False  # that atom is a group or a rule reference (it may match nothing)
    for m in _GBNF_TOKEN.finditer(grammar):
        kind = m.lastgroup
        if kind == "com":
            continue
        if kind in ("str", "cls"):
            last_is_group = False
            # llama.cpp repeats a literal or class element by element (escapes make the length
            # an overestimate); unrepeated, it counts once, like any other atom.
            last = max(len(m.group()) - 2, 1)
            current += 1
        elif kind in ("tok", "ref"):
            last = 1
            current += 1
            last_is_group = kind == "ref" and m.group() != "."
        elif kind == "rule":
            rules += 1
            if rules + groups > GRAMMAR_MAX_RULES:
                raise _too(
                    "grammar rule count",
                    rules + groups,
                    GRAMMAR_MAX_RULES,
                    "use fewer rules and groups",
                )
            expanded += current + sum(stack)
            current = last = 0
            depth = 0  # a new rule starts at the top level; stray ( are llama.cpp's to report
            stack.clear()
        elif kind == "rep":
            bounds = _REP_BOUNDS.fullmatch(m.group())
            if bounds is None:
                continue  # malformed: llama.cpp's parser says so
            hint = "use a smaller repetition count or `*`/`+`"
            lo = _bound(
                bounds.group(1) or "0", "grammar repetition count", GRAMMAR_MAX_REPETITION, hint
            )
            hi_text = bounds.group(3)
            hi = (
                _bound(hi_text, "grammar repetition count", GRAMMAR_MAX_REPETITION, hint)
                if hi_text
                else lo + 1
            )
            if last_is_group and max(lo, hi) > GRAMMAR_MAX_GROUP_REPETITION:
                raise _too(
                    "grammar repetition count of a group or rule",
                    max(lo, hi),
                    GRAMMAR_MAX_GROUP_REPETITION,
                    "repeat a literal or character class instead, or use `*`/`+`",
                )
            added = last * max(lo, hi)
            current += added
            if current + expanded > GRAMMAR_MAX_EXPANDED:
                raise _too(
                    "grammar size after expanding repetitions",
                    f"{current + expanded} elements",
                    GRAMMAR_MAX_EXPANDED,
                    "use smaller repetition counts",
                )
        else:
            op = m.group()
            if op == "(":
                depth += 1
                groups += 1
                if depth > max_depth:
                    max_depth = depth
                    if depth > GRAMMAR_MAX_NESTING:
                        raise _too(
                            "grammar nesting depth",
                            _total_depth(grammar, m.start()),
                            GRAMMAR_MAX_NESTING,
                            "flatten the grammar into named rules",
                        )
                if rules + groups > GRAMMAR_MAX_RULES:
                    raise _too(
                        "grammar rule count",
                        rules + groups,
                        GRAMMAR_MAX_RULES,
                        "use fewer rules and groups",
                    )
                stack.append(current)
                current = last = 0
            elif op == ")":
                depth = max(depth - 1, 0)
                # A repetition of the group repeats everything in it (nested ones multiply).
                last = current
                current = (stack.pop() if stack else 0) + last
                last_is_group = True
            elif op == "|":
                alternatives += 1
                if alternatives > GRAMMAR_MAX_ALTERNATIVES:
                    raise _too(
                        "grammar alternative count",
                        _count_alternatives(grammar),
                        GRAMMAR_MAX_ALTERNATIVES,
                        "use fewer alternatives",
                    )
            # * + ?: one new rule referring to the element; no expansion.
        if current + expanded > GRAMMAR_MAX_EXPANDED:
            raise _too(
                "grammar size after expanding repetitions",
                f"{current + expanded} elements",
                GRAMMAR_MAX_EXPANDED,
                "use smaller repetition counts",
            )


def _total_depth(grammar: str, start: int) -> int:
    """The full nesting depth, for the error message (the check stops at the limit)."""
    import numpy as np

    # Brackets inside strings, classes, token references and comments do not count.
    stripped = _QUOTED.sub(" ", grammar[start:]).encode("ascii", "replace")
    chars = np.frombuffer(stripped, dtype=np.uint8)
    steps = (chars == ord("(")).astype(np.int64) - (chars == ord(")"))
    # `start` is the bracket that went past the limit: the levels above it are the limit.
    return GRAMMAR_MAX_NESTING + int(np.cumsum(steps).max(initial=1))


_QUOTED = re.compile(r'"(?:\\.|[^"\\])*"?|\[(?:\\.|[^\]\\])*\]?|#[^\n]*|<[^>\n]*>', re.DOTALL)


def _count_alternatives(grammar: str) -> int:
    return sum(1 for m in _GBNF_TOKEN.finditer(grammar) if m.group() == "|")


# --- JSON schema ---------------------------------------------------------------------------------

_PATTERN_TOKEN = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|[()|*+?]|.", re.DOTALL)


def _pattern_estimate(pattern: str, where: str) -> int:
    """Characters of grammar a regex `pattern` turns into: repetitions of groups multiply."""
    if len(pattern) > SCHEMA_MAX_PATTERN:
        raise _too(
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
            lo = _bound(bounds.group(1) or "0", what, SCHEMA_MAX_REPETITION, hint)
            hi = (
                _bound(bounds.group(3), what, SCHEMA_MAX_REPETITION, hint)
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
            raise _too(
                f"{where}: estimated grammar size of the pattern",
                f"{current} bytes",
                SCHEMA_MAX_ESTIMATE,
                "use a simpler pattern",
            )
    return current + sum(stack)


def check_schema(schema: Any) -> None:
    """Raise GrammarLimitError when turning `schema` into a grammar would be too costly.

    One pass over the document with an explicit stack: node count, nesting depth, repetition
    bounds, enum sizes, patterns, local-only `$ref`, and an estimate of the grammar's size.
    """
    estimate = 0
    nodes = 0
    enums = 0
    # (node, depth, path for messages, length of the rule name the converter gives it)
    stack: list[tuple[Any, int, str, int]] = [(schema, 1, "", 4)]
    while stack:
        node, depth, path, rule_len = stack.pop()
        if not isinstance(node, dict | list):
            continue
        nodes += 1
        if nodes > SCHEMA_MAX_NODES:
            raise _too(
                "json_schema node count",
                f"over {SCHEMA_MAX_NODES}",
                SCHEMA_MAX_NODES,
                "use a smaller schema",
            )
        if depth > SCHEMA_MAX_DEPTH:
            raise _too(
                "json_schema nesting depth",
                f"over {SCHEMA_MAX_DEPTH}",
                SCHEMA_MAX_DEPTH,
                "flatten the schema or use $defs",
            )
        if isinstance(node, list):
            stack.extend((item, depth + 1, path, rule_len + 4) for item in node)
            continue
        where = f"json_schema{path or ''}"
        # A string repeats the `char` rule; an array its item rule, named after the property
        # path; either way with a separator and brackets around each repetition.
        item_len = {"Length": 10, "Items": rule_len + 16, "Properties": rule_len + 32}
        for key in _REPETITION_KEYS:
            value = node.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value) or value > SCHEMA_MAX_REPETITION:
                shown = int(value) if math.isfinite(value) and value == int(value) else value
                raise _too(
                    f"{where} {key}", shown, SCHEMA_MAX_REPETITION, f"lower {key} or leave it out"
                )
            if value > 0:
                estimate += int(value) * item_len.get(key[3:], rule_len + 16)
        for key in ("enum", "const"):
            if key in node:
                values = node[key] if key == "enum" and isinstance(node[key], list) else [node[key]]
                enums += len(values)
                if enums > SCHEMA_MAX_ENUM:
                    raise _too(
                        "json_schema enum values",
                        f"over {SCHEMA_MAX_ENUM}",
                        SCHEMA_MAX_ENUM,
                        "use fewer enum values",
                    )
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise GrammarLimitError(
                f"{where}: $ref {ref[:100]!r} is not supported; only references into the same "
                "schema (starting with '#') are"
            )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            estimate += _pattern_estimate(pattern, where)
        if estimate > SCHEMA_MAX_ESTIMATE:
            raise _too(
                "json_schema estimated grammar size",
                f"over {SCHEMA_MAX_ESTIMATE} bytes",
                SCHEMA_MAX_ESTIMATE,
                "use smaller repetition bounds or a smaller schema",
            )
        for key, value in node.items():
            if isinstance(value, dict | list):
                name = key if isinstance(key, str) else ""
                child = f"{path}.{name}" if len(path) < 1000 else path
                if path.endswith(".properties"):
                    child_len = rule_len + len(name) + 1
                else:
                    child_len = rule_len + 5
                stack.append((value, depth + 1, child, child_len))
    # Literals (enum values, property names, descriptions are not in the grammar) are at most
    # the document's own size; the walk above bounded that document.
    size = len(json.dumps(schema, ensure_ascii=False))
    if estimate + size > SCHEMA_MAX_ESTIMATE:
        raise _too(
            "json_schema estimated grammar size",
            f"{estimate + size} bytes",
            SCHEMA_MAX_ESTIMATE,
            "use smaller repetition bounds or a smaller schema",
        )
