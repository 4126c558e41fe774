"""The limits on GBNF grammars and JSON schemas (one place), and the errors they raise.

Why each limit is where it is: `limits`, which checks grammars against them;
`schema_limits` checks JSON schemas.
"""

from __future__ import annotations

from localfab.errors import UsageError

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
# Nested objects/arrays in the schema document (an object's properties take two: the property's
# schema and `properties`). llama-server sets none: its converter recurses until the stack ends.
# The converter here is Python's, which stops near 1000 frames; at 512 every shape of schema
# still converts or is refused in one line (deeper objects and arrays make grammars past
# GRAMMAR_MAX_BYTES anyway: a rule's name grows with its path).
SCHEMA_MAX_DEPTH = 512
SCHEMA_MAX_REPETITION = 1000  # minLength/maxLength/minItems/maxItems/min-maxProperties
SCHEMA_MAX_ENUM = 1000  # values across all `enum`s (OpenAI's own limit): each is an alternative
SCHEMA_MAX_PATTERN = 2000  # characters in one `pattern`
SCHEMA_MAX_ESTIMATE = GRAMMAR_MAX_BYTES  # estimated size of the grammar the schema turns into


class GrammarLimitError(UsageError):
    """A grammar or JSON schema past one of the limits above; the message names the limit."""


class GrammarDeadEnd(UsageError):
    """The grammar (with logit_bias / ignore_eos) lets no token continue the reply."""


def too(what: str, value: int | float | str, limit: int, hint: str) -> GrammarLimitError:
    return GrammarLimitError(f"{what} {value} exceeds the limit of {limit}; {hint}")


def bound(text: str, what: str, limit: int, hint: str) -> int:
    # Long digit strings are rejected by length first: int() of a huge string is itself slow.
    if len(text) > 9 or int(text) > limit:
        raise too(what, text if len(text) <= 24 else text[:20] + "...", limit, hint)
    return int(text)
