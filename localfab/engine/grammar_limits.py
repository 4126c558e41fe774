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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
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
# Nullable elements (`x?`, `x*`, `x+`, `x{m,n}` with m < n: each an alternative with an empty
# branch in llama.cpp) that one position reaches without consuming a character. Each is one more
# way to split a token's text, and llama.cpp's sampler tries every split for every token of the
# vocabulary: `"a"? ` x 100 costs seconds a token. One that may start with almost any character
# (a negated class, `.`, a rule not defined yet) counts 3. Measured on a 262k vocabulary (CPU time
# per token): `[ \t\n]? ` x 5 46 ms, x 6 91 ms; `[^"]? ` x 1 31 ms, x 2 65 ms; llama.cpp's
# json.gbnf (a run of 4) 26 ms; a bare `[^"]` 23 ms.
GRAMMAR_MAX_NULLABLE_RUN = 5
# Nullable elements in the whole grammar, repetitions of groups multiplied.
GRAMMAR_MAX_NULLABLE = 50_000
# Characters and ranges in one character class: llama.cpp scans them one by one for every
# character it tries (`[^aaa...]` of 100k characters costs seconds a token; 128 costs 41 ms,
# 256 60 ms, 1024 170 ms), and in all classes together (llama.cpp's own grammars have <= 53).
GRAMMAR_MAX_CLASS = 128
GRAMMAR_MAX_CLASS_TOTAL = 2048

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
    | (?P<com>\#[^\r\n]*)
    | (?P<tok><[^>\n]*>)
    | (?P<rule>::=)
    | (?P<rep>\{(?:\#[^\r\n]*|[^}\#])*\}?)
    | (?P<op>[()|*+?])
    | (?P<ref>[A-Za-z0-9_.-]+)
    """,
    re.VERBOSE | re.DOTALL,
)
_REP_BOUNDS = re.compile(r"\{\s*(\d*)\s*(?:(,)\s*(\d*)\s*)?\}")
# llama.cpp skips spaces, newlines and `#` comments between the parts of `{m,n}`.
_REP_SPACE = re.compile(r"\#[^\r\n]*|\s+")
_GBNF_REP_BOUNDS = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


# An element's reach: (lead, trail, through, total). `lead`: nullable elements reachable from its
# start without consuming a character; `trail`: those reachable backwards from its end; `through`:
# those passed when it matches nothing (-1: it cannot); `total`: nullable elements in it,
# repetitions multiplied.
_Reach = tuple[int, int, int, int]
_FIXED: _Reach = (0, 0, -1, 0)
_UNKNOWN: tuple[_Reach, int] = (_FIXED, 3)  # a rule not defined yet
_BIG = 10**9


class _Nullables:
    """Runs of nullable elements, computed alongside check_grammar's single pass."""

    def __init__(self, known: dict[str, tuple[_Reach, int]]) -> None:
        self.known = known  # rules seen in an earlier pass: a reference reaches what they do
        self.rules: dict[str, tuple[_Reach, int]] = {}  # reach and weight of each rule
        self.forward: set[str] = set()  # rules referred to before their definition
        self.added = False  # the last reference added its name to `forward`
        self.total = 0
        self.name = ""
        self.top_alts: list[_Reach] = []  # finished alternatives of the rule itself
        self.top_w = 1
        self.w = 1  # weight of the pending element's own optional branch
        self._start_rule()

    def _start_rule(self) -> None:
        self.frames: list[list[_Reach]] = []  # finished alternatives of each open group
        self.seqs: list[list[int]] = [[0, 0, 0, 0]]  # lead, run, through, total of each sequence
        # Weight of what can come first in each open sequence / finished group alternatives.
        self.seq_w: list[int] = [1]
        self.frame_w: list[int] = []
        self.pending: _Reach | None = None
        self.pending_name = ""

    @staticmethod
    def check(run: int) -> None:
        if run > GRAMMAR_MAX_NULLABLE_RUN:
            raise _too(
                "grammar run of optional elements",
                f"{min(run, _BIG)} (`?`, `*`, `+`, `{{m,n}}` in a row; one that may start with "
                "almost any character counts 3)",
                GRAMMAR_MAX_NULLABLE_RUN,
                "make fewer elements in a row optional, or nest them: `(x (x)?)?`",
            )

    def _add(self, seq: list[int], a: _Reach) -> None:
        lead, run, through, total = seq
        al, at, ath, atot = a
        self.check(run + al)
        if through >= 0:
            lead = max(lead, through + al)
        if ath >= 0:
            run = min(max(run + ath, at), _BIG)
            through = through + ath if through >= 0 else -1
        else:
            run, through = at, -1
        self.check(run)
        seq[:] = [lead, run, through, min(total + atot, _BIG)]

    @staticmethod
    def _end(seq: list[int]) -> _Reach:
        lead, run, through, total = seq
        return (max(lead, through), run, through, total)

    def _flush(self) -> None:
        if self.pending is not None:
            if self.seqs[-1][2] >= 0:  # all before it may match nothing: it can come first
                self.seq_w[-1] = max(self.seq_w[-1], self.w)
            self._add(self.seqs[-1], self.pending)
            self.pending = None

    def atom(self, name: str = "", wide: bool = False) -> None:
        self._flush()
        # An optional part that can start with almost any character (a negated class, `.`, a
        # rule not seen yet) splits every token of the vocabulary many ways: it counts 3 times.
        self.added = bool(name) and name not in self.rules and name not in self.forward
        if self.added:
            self.forward.add(name)
        if name:  # a rule defined above, else one known from the first pass
            reach, self.w = self.rules.get(name) or self.known.get(name, _UNKNOWN)
        else:
            reach, self.w = _FIXED, 1
        if wide:
            self.w = 3
        self.pending = (*reach[:3], 0)  # the rule's own elements are counted where it is defined
        self.pending_name = name

    def op(self, op: str) -> None:
        a = self.pending
        if a is None:
            return  # llama.cpp reports the stray operator
        al, at, ath, atot = a
        if op in "*+":
            # `x+` is `x x*`: it must match something, but how much is open, and the split of a
            # token's text between it and its neighbours is as open as with `x*`.
            self.pending = self._star(a)
        else:
            w = self.w
            self.pending = (al + w, max(at, w), max(ath, 0) + w, min(atot + 1, _BIG))
        self._count(self.pending[3] - atot)

    def _star(self, a: _Reach) -> _Reach:
        al, at, ath, atot = a
        w = self.w
        self.check(at + al + w)  # one repetition's end meets the next one's start
        return (al + w, at + w, max(ath, 0) + w, min(atot + 1, _BIG))

    def rep(self, lo: int, hi: int | None) -> None:
        a = self.pending
        if a is None:
            return
        al, at, ath, atot = a
        opt = 1 if hi is None or lo < hi else 0
        w = self.w * opt
        n = max(lo, hi or lo + 1)
        if ath >= 0:  # every copy of a part that may match nothing adds to the run
            reach = min(n * max(ath, al, at, 1) + w, _BIG)
            new = (reach, reach, min(n * ath + w, _BIG), min(n * atot + opt, _BIG))
        else:
            if n > 1:
                self.check(at + al + w)
            if lo == 0:
                new = (al + w, at + w, w, min(n * atot + opt, _BIG))
            else:
                new = (al, at + w, -1, min(n * atot + opt, _BIG))
        self.pending = new
        self._count(new[3] - atot)

    def _count(self, added: int) -> None:
        self.total = min(self.total + max(added, 0), _BIG)
        if self.total > GRAMMAR_MAX_NULLABLE:
            raise _too(
                "grammar optional element count",
                self.total,
                GRAMMAR_MAX_NULLABLE,
                "use fewer `?`, `*`, `+` and `{m,n}`, or smaller repetition counts",
            )

    def open(self) -> None:
        self._flush()
        self.frames.append([])
        self.frame_w.append(1)
        self.seqs.append([0, 0, 0, 0])
        self.seq_w.append(1)

    def bar(self) -> None:
        self._flush()
        if self.frames:
            self.frames[-1].append(self._end(self.seqs.pop()))
            self.frame_w[-1] = max(self.frame_w[-1], self.seq_w.pop())
        else:
            self.top_alts.append(self._end(self.seqs.pop()))
            self.top_w = max(self.top_w, self.seq_w.pop())
        self.seqs.append([0, 0, 0, 0])
        self.seq_w.append(1)

    def close(self) -> None:
        self._flush()
        if not self.frames:
            return  # a stray `)`: llama.cpp reports it
        alts = self.frames.pop()
        alts.append(self._end(self.seqs.pop()))
        self.pending = self._join(alts)
        self.w = max(self.frame_w.pop(), self.seq_w.pop())

    @staticmethod
    def _join(alts: list[_Reach]) -> _Reach:
        lead = max(a[0] for a in alts)
        trail = max(a[1] for a in alts)
        throughs = [a[2] for a in alts if a[2] >= 0]
        total = min(sum(a[3] for a in alts), _BIG)
        if not throughs:
            return (lead, trail, -1, total)
        # An empty alternative beside others is one more way to match nothing, like `?`.
        extra = 1 if len(alts) > 1 else 0
        return (lead + extra, max(trail, extra), max(throughs) + extra, total)

    def rule(self, name: str) -> None:
        """`name ::=` begins a rule; the reference to `name` just seen is its name, not an atom."""
        if self.added:  # the name was taken for a reference
            self.forward.discard(name)
        self.pending = None
        self.end_rule()
        self.name = name

    def end_rule(self) -> None:
        self._flush()
        while self.frames:  # unclosed groups: llama.cpp reports them
            self.close()
            self._flush()
        alts = [*self.top_alts, self._end(self.seqs.pop())]
        if self.name:
            self.rules[self.name] = (self._join(alts), max(self.top_w, self.seq_w.pop()))
        self.top_alts = []
        self.top_w = 1
        self._start_rule()


def _bound(text: str, what: str, limit: int, hint: str) -> int:
    # Long digit strings are rejected by length first: int() of a huge string is itself slow.
    if len(text) > 9 or int(text) > limit:
        raise _too(what, text if len(text) <= 24 else text[:20] + "...", limit, hint)
    return int(text)


def check_grammar(grammar: str) -> None:
    """Raise GrammarLimitError when `grammar` (GBNF) is past a limit; cheap and linear."""
    # A reference to a rule defined further down reads as one that must match something; a
    # second pass knows those rules. Only one: through recursive rules the reach grows with the
    # input (`term ::= "-" term | ...`), not with the grammar, and would never settle.
    rules, forward = _scan(grammar, {})
    if any(rules.get(name, _UNKNOWN)[0] != _FIXED for name in forward):
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
        raise _too(
            "grammar size",
            f"{len(grammar.encode('utf-8', 'replace'))} bytes",
            GRAMMAR_MAX_BYTES,
            "use a smaller grammar",
        )


class _Scanner:
    """One pass over a GBNF text, counting what llama.cpp's parser would build."""

    def __init__(self, grammar: str, known: dict[str, tuple[_Reach, int]]) -> None:
        self.grammar = grammar
        self.depth = self.max_depth = 0
        self.rules = self.groups = self.alternatives = 0
        self.expanded = 0
        self.stack: list[int] = []  # elements in each open group
        self.current = 0  # elements in the innermost open sequence
        self.last = 0  # elements of the atom a following repetition operator applies to
        self.last_is_group = False  # that atom is a group or a rule reference (may be empty)
        self.runs = _Nullables(known)
        self.class_total = 0

    def scan(self) -> tuple[dict[str, tuple[_Reach, int]], set[str]]:
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
            raise _too(
                "grammar size after expanding repetitions",
                f"{self.current + self.expanded} elements",
                GRAMMAR_MAX_EXPANDED,
                "use smaller repetition counts",
            )

    def _check_rule_count(self) -> None:
        if self.rules + self.groups > GRAMMAR_MAX_RULES:
            raise _too(
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
            raise _too(
                "grammar character class size",
                f"{size} characters",
                GRAMMAR_MAX_CLASS,
                "use ranges (`[a-z]`) or fewer characters in one class",
            )
        if self.class_total > GRAMMAR_MAX_CLASS_TOTAL:
            raise _too(
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
        lo = _bound(bounds.group(1), "grammar repetition count", GRAMMAR_MAX_REPETITION, hint)
        hi_text = bounds.group(3)
        hi = (
            _bound(hi_text, "grammar repetition count", GRAMMAR_MAX_REPETITION, hint)
            if hi_text
            else lo + 1
        )
        if self.last_is_group and max(lo, hi) > GRAMMAR_MAX_GROUP_REPETITION:
            raise _too(
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
                raise _too(
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
                raise _too(
                    "grammar nesting depth",
                    _total_depth(self.grammar, start),
                    GRAMMAR_MAX_NESTING,
                    "flatten the grammar into named rules",
                )
        self._check_rule_count()
        self.stack.append(self.current)
        self.current = self.last = 0


def _scan(
    grammar: str, known: dict[str, tuple[_Reach, int]]
) -> tuple[dict[str, tuple[_Reach, int]], set[str]]:
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


# (node, depth, path for messages, length of the rule name the converter gives it)
_SchemaItem = tuple[Any, int, str, int]


def _check_walk(nodes: int, depth: int) -> None:
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
            raise _too(
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
        raise _too(
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
            raise _too(
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
