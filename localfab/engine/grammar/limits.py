"""Limits on GBNF grammars and JSON schemas, checked before llama.cpp or the converter sees them.

llama.cpp's grammar parser recurses once per nested group (100k nested parentheses overflow
the stack), copies a repeated element once per repetition (`"x"{0,1000000}`), and its sampler
keeps one parse stack per alternative that can start here, each compared against the whole
vocabulary on every token; runs of optional elements multiply the ways a token's text can be
split between them, all of which the sampler tries, and it scans a character class's characters
one by one. llama-cpp-python's JSON-schema converter turns `maxLength: N` into N
nested groups and builds the whole string first. A request past any of these limits gets a 400
that names the limit instead of a crashed or frozen server.

The limits leave room for every grammar in llama.cpp's `grammars/` folder and for typical
structured-output schemas. The checks are single linear passes over input bounded in size.

The limits themselves are in `bounds`, the count of nullable runs in `nullables`
and the JSON-schema checks in `schema_limits`; all are importable from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from localfab.engine.grammar.bounds import (
    GRAMMAR_MAX_ALTERNATIVES,
    GRAMMAR_MAX_BYTES,
    GRAMMAR_MAX_CLASS,
    GRAMMAR_MAX_CLASS_TOTAL,
    GRAMMAR_MAX_EXPANDED,
    GRAMMAR_MAX_GROUP_REPETITION,
    GRAMMAR_MAX_NESTING,
    GRAMMAR_MAX_NULLABLE,
    GRAMMAR_MAX_NULLABLE_RUN,
    GRAMMAR_MAX_REPETITION,
    GRAMMAR_MAX_RULES,
    SCHEMA_MAX_DEPTH,
    SCHEMA_MAX_ENUM,
    SCHEMA_MAX_ESTIMATE,
    SCHEMA_MAX_NODES,
    SCHEMA_MAX_PATTERN,
    SCHEMA_MAX_REPETITION,
    GrammarDeadEnd,
    GrammarLimitError,
    bound,
    too,
)
from localfab.engine.grammar.nullables import FIXED, UNKNOWN, Nullables, Reach
from localfab.engine.grammar.schema_limits import check_schema

__all__ = [
    "GRAMMAR_MAX_ALTERNATIVES",
    "GRAMMAR_MAX_BYTES",
    "GRAMMAR_MAX_CLASS",
    "GRAMMAR_MAX_CLASS_TOTAL",
    "GRAMMAR_MAX_EXPANDED",
    "GRAMMAR_MAX_GROUP_REPETITION",
    "GRAMMAR_MAX_NESTING",
    "GRAMMAR_MAX_NULLABLE",
    "GRAMMAR_MAX_NULLABLE_RUN",
    "GRAMMAR_MAX_REPETITION",
    "GRAMMAR_MAX_RULES",
    "SCHEMA_MAX_DEPTH",
    "SCHEMA_MAX_ENUM",
    "SCHEMA_MAX_ESTIMATE",
    "SCHEMA_MAX_NODES",
    "SCHEMA_MAX_PATTERN",
    "SCHEMA_MAX_REPETITION",
    "GrammarDeadEnd",
    "GrammarLimitError",
    "check_grammar",
    "check_schema",
]

# --- GBNF ----------------------------------------------------------------------------------------

# One token of GBNF that matters for the limits. Strings, character classes, token references and
# comments are matched whole so that brackets inside them do not count.
_GBNF_TOKEN = re.compile(
    r"""
    (?P<str>"(?:\\.|[^"\\])*"?)
    | (?P<cls>\[(?:\\.|[^\]\\])*\]?)
    | (?P<com>\#[^\r\n]*)
    | (?P<tok><[^>\n]*>)
    | (?P<rule>::=)
    | (?P<rep>\{(?:\#[^\r\n]*|[^}\#])*\}?)
    | (?P<op>[()|*+?])
    | (?P<ref>[A-Za-z0-9_.-]+)
    """,
    re.VERBOSE | re.DOTALL,
)
# llama.cpp skips spaces, newlines and `#` comments between the parts of `{m,n}`.
_REP_SPACE = re.compile(r"\#[^\r\n]*|\s+")
_GBNF_REP_BOUNDS = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


def check_grammar(grammar: str) -> None:
    """Raise GrammarLimitError when `grammar` (GBNF) is past a limit; cheap and linear."""
    # A reference to a rule defined further down reads as one that must match something; a
    # second pass knows those rules. Only one: through recursive rules the reach grows with the
    # input (`term ::= "-" term | ...`), not with the grammar, and would never settle.
    rules, forward = _scan(grammar, {})
    if any(rules.get(name, UNKNOWN)[0] != FIXED for name in forward):
        _scan(grammar, rules)


_CLASS_ITEM = re.compile(r"\\x[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}|\\.|.", re.DOTALL)


def _class_size(cls: str) -> int:
    """Characters and ranges in a class token `[...]` (a range counts as its two ends)."""
    body = cls[1:-1] if cls.endswith("]") else cls[1:]
    return sum(1 for item in _CLASS_ITEM.finditer(body.removeprefix("^")) if item.group() != "-")


def _check_size(grammar: str) -> None:
    if len(grammar) > GRAMMAR_MAX_BYTES or len(grammar.encode("utf-8", "replace")) > (
        GRAMMAR_MAX_BYTES
    ):
        raise too(
            "grammar size",
            f"{len(grammar.encode('utf-8', 'replace'))} bytes",
            GRAMMAR_MAX_BYTES,
            "use a smaller grammar",
        )


class _Scanner:
    """One pass over a GBNF text, counting what llama.cpp's parser would build."""

    def __init__(self, grammar: str, known: dict[str, tuple[Reach, int]]) -> None:
        self.grammar = grammar
        self.depth = self.max_depth = 0
        self.rules = self.groups = self.alternatives = 0
        self.expanded = 0
        self.stack: list[int] = []  # elements in each open group
        self.current = 0  # elements in the innermost open sequence
        self.last = 0  # elements of the atom a following repetition operator applies to
        self.last_is_group = False  # that atom is a group or a rule reference (may be empty)
        self.runs = Nullables(known)
        self.class_total = 0

    def scan(self) -> tuple[dict[str, tuple[Reach, int]], set[str]]:
        handlers: dict[str | None, Callable[[re.Match[str]], None]] = {
            "str": self._literal,
            "cls": self._literal,
            "tok": self._reference,
            "ref": self._reference,
            "rule": self._rule,
            "rep": self._repetition,
        }
        for m in _GBNF_TOKEN.finditer(self.grammar):
            kind = m.lastgroup
            if kind == "com":
                continue
            handlers.get(kind, self._operator)(m)
            self._check_expanded()
        self.runs.end_rule()
        return self.runs.rules, self.runs.forward

    def _check_expanded(self) -> None:
        if self.current + self.expanded > GRAMMAR_MAX_EXPANDED:
            raise too(
                "grammar size after expanding repetitions",
                f"{self.current + self.expanded} elements",
                GRAMMAR_MAX_EXPANDED,
                "use smaller repetition counts",
            )

    def _check_rule_count(self) -> None:
        if self.rules + self.groups > GRAMMAR_MAX_RULES:
            raise too(
                "grammar rule count",
                self.rules + self.groups,
                GRAMMAR_MAX_RULES,
                "use fewer rules and groups",
            )

    def _literal(self, m: re.Match[str]) -> None:
        self.runs.atom(wide=m.group().startswith("[^"))
        if m.lastgroup == "cls":
            self._check_class(m.group())
        self.last_is_group = False
        # llama.cpp repeats a literal or class element by element (escapes make the length
        # an overestimate); unrepeated, it counts once, like any other atom.
        self.last = max(len(m.group()) - 2, 1)
        self.current += 1

    def _check_class(self, token: str) -> None:
        size = _class_size(token)
        self.class_total += size
        if size > GRAMMAR_MAX_CLASS:
            raise too(
                "grammar character class size",
                f"{size} characters",
                GRAMMAR_MAX_CLASS,
                "use ranges (`[a-z]`) or fewer characters in one class",
            )
        if self.class_total > GRAMMAR_MAX_CLASS_TOTAL:
            raise too(
                "grammar character classes' total size",
                f"{self.class_total} characters",
                GRAMMAR_MAX_CLASS_TOTAL,
                "use ranges (`[a-z]`) or fewer character classes",
            )

    def _reference(self, m: re.Match[str]) -> None:
        is_rule = m.lastgroup == "ref" and m.group() != "."
        self.runs.atom(m.group() if is_rule else "", m.group() == ".")
        self.last = 1
        self.current += 1
        self.last_is_group = is_rule

    def _rule(self, _m: re.Match[str]) -> None:
        self.runs.rule(self.runs.pending_name)
        self.rules += 1
        self._check_rule_count()
        self.expanded += self.current + sum(self.stack)
        self.current = self.last = 0
        self.depth = 0  # a new rule starts at the top level; stray ( are llama.cpp's to report
        self.stack.clear()

    def _repetition(self, m: re.Match[str]) -> None:
        # As llama.cpp reads it: spaces, newlines and comments between the parts skipped.
        bounds = _GBNF_REP_BOUNDS.fullmatch(_REP_SPACE.sub("", m.group()))
        if bounds is None:
            shown = m.group() if len(m.group()) <= 40 else m.group()[:36] + "..."
            raise GrammarLimitError(
                f"grammar repetition {shown!r} is not of the form {{m}}, {{m,}} or {{m,n}}; "
                "write the counts as plain numbers"
            )
        hint = "use a smaller repetition count or `*`/`+`"
        lo = bound(bounds.group(1), "grammar repetition count", GRAMMAR_MAX_REPETITION, hint)
        hi_text = bounds.group(3)
        hi = (
            bound(hi_text, "grammar repetition count", GRAMMAR_MAX_REPETITION, hint)
            if hi_text
            else lo + 1
        )
        if self.last_is_group and max(lo, hi) > GRAMMAR_MAX_GROUP_REPETITION:
            raise too(
                "grammar repetition count of a group or rule",
                max(lo, hi),
                GRAMMAR_MAX_GROUP_REPETITION,
                "repeat a literal or character class instead, or use `*`/`+`",
            )
        self.runs.rep(lo, hi if hi_text else (None if bounds.group(2) else lo))
        self.current += self.last * max(lo, hi)

    def _operator(self, m: re.Match[str]) -> None:
        op = m.group()
        if op in "?*+":
            # One new rule referring to the element; no expansion.
            self.runs.op(op)
        elif op == "(":
            self._open(m.start())
        elif op == ")":
            self.runs.close()
            self.depth = max(self.depth - 1, 0)
            # A repetition of the group repeats everything in it (nested ones multiply).
            self.last = self.current
            self.current = (self.stack.pop() if self.stack else 0) + self.last
            self.last_is_group = True
        elif op == "|":
            self.runs.bar()
            self.alternatives += 1
            if self.alternatives > GRAMMAR_MAX_ALTERNATIVES:
                raise too(
                    "grammar alternative count",
                    _count_alternatives(self.grammar),
                    GRAMMAR_MAX_ALTERNATIVES,
                    "use fewer alternatives",
                )

    def _open(self, start: int) -> None:
        self.runs.open()
        self.depth += 1
        self.groups += 1
        if self.depth > self.max_depth:
            self.max_depth = self.depth
            if self.depth > GRAMMAR_MAX_NESTING:
                raise too(
                    "grammar nesting depth",
                    _total_depth(self.grammar, start),
                    GRAMMAR_MAX_NESTING,
                    "flatten the grammar into named rules",
                )
        self._check_rule_count()
        self.stack.append(self.current)
        self.current = self.last = 0


def _scan(
    grammar: str, known: dict[str, tuple[Reach, int]]
) -> tuple[dict[str, tuple[Reach, int]], set[str]]:
    _check_size(grammar)
    return _Scanner(grammar, known).scan()


def _total_depth(grammar: str, start: int) -> int:
    """The full nesting depth, for the error message (the check stops at the limit)."""
    import numpy as np

    # Brackets inside strings, classes, token references and comments do not count.
    stripped = _QUOTED.sub(" ", grammar[start:]).encode("ascii", "replace")
    chars = np.frombuffer(stripped, dtype=np.uint8)
    steps = (chars == ord("(")).astype(np.int64) - (chars == ord(")"))
    # `start` is the bracket that went past the limit: the levels above it are the limit.
    return GRAMMAR_MAX_NESTING + int(np.cumsum(steps).max(initial=1))


_QUOTED = re.compile(r'"(?:\\.|[^"\\])*"?|\[(?:\\.|[^\]\\])*\]?|#[^\r\n]*|<[^>\n]*>', re.DOTALL)


def _count_alternatives(grammar: str) -> int:
    return sum(1 for m in _GBNF_TOKEN.finditer(grammar) if m.group() == "|")
