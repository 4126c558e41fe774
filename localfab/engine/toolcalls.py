"""A reply's tool calls inside the token step (see `callparser` for the parser itself).

`ToolCalling` is what a request with tools asks of the engine; `ToolStep` rides in a reply's
`ReplyState` beside the reasoning split, so calls are found alike on one sequence, on the
server's parallel slots and under speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from localfab.engine.callparser import CallParser, Piece
from localfab.engine.callsyntax import CallDelta, CallSyntax


@dataclass(frozen=True)
class ToolCalling:
    """A request's tools as the token step needs them: the syntax, the names a call may use
    (None: any), each tool's argument types (for "xml" values), whether a reply may make
    several calls, and whether a lazy grammar sees the text inside a reasoning block (False:
    a call written while thinking is reasoning, and cannot set the grammar off)."""

    syntax: CallSyntax
    names: frozenset[str] | None = None
    value_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    parallel: bool = True
    grammar_in_reasoning: bool = False

    def parser(self) -> CallParser:
        types = {name: dict(kinds) for name, kinds in self.value_types}
        return CallParser(self.syntax, self.names, value_types=types, parallel=self.parallel)


Parts = tuple[tuple[str, str], ...]


class ToolStep:
    """A reply's calls inside the token step: the answer's pieces (from the reasoning split,
    or the token's text) go through the parser; reasoning passes untouched."""

    def __init__(self, calling: ToolCalling) -> None:
        self.parser = calling.parser()

    def take(self, parts: Parts, *, final: bool = False) -> tuple[Parts, tuple[CallDelta, ...]]:
        out: list[tuple[str, str]] = []
        calls: list[CallDelta] = []
        parser = self.parser
        for kind, text in parts:
            if kind != "content":
                out.append((kind, text))
                continue
            for piece in parser.feed(text):
                _sort(piece, out, calls)
        if final:
            for piece in parser.finish():
                _sort(piece, out, calls)
        return tuple(out), tuple(calls)


def _sort(piece: Piece, out: list[tuple[str, str]], calls: list[CallDelta]) -> None:
    if piece[0] == "content":
        if out and out[-1][0] == "content":
            out[-1] = ("content", out[-1][1] + piece[1])
        else:
            out.append(piece)
    else:
        calls.append(piece[1])
