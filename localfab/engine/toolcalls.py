"""A reply's tool calls inside the token step (see `callparser` for the parser itself).

`ToolCalling` is what a request with tools asks of the engine; `ToolStep` rides in a reply's
`ReplyState` beside the reasoning split, so calls are found alike on one sequence, on the
server's parallel slots and under speculative decoding. With `ToolCalling.loose`, a reply that
is only a bare JSON call is a call too (`loosecalls`): its text is held back while it may be
one, and read once the reply ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from localfab.engine.callparser import CallParser, Piece
from localfab.engine.callsyntax import CallDelta, CallSyntax
from localfab.engine.loosecalls import LooseCalls, LooseWatch


@dataclass(frozen=True)
class ToolCalling:
    """A request's tools as the token step needs them: the syntax, the names a call may use
    (None: any), each tool's argument types (for "xml" values), whether a reply may make
    several calls, whether a lazy grammar sees the text inside a reasoning block (False:
    a call written while thinking is reasoning, and cannot set the grammar off), and the
    tools' shapes by which a reply that is a bare JSON call is read as one (None: it is text,
    as llama-server has it)."""

    syntax: CallSyntax
    names: frozenset[str] | None = None
    value_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    parallel: bool = True
    grammar_in_reasoning: bool = False
    loose: LooseCalls | None = None

    def parser(self) -> CallParser:
        types = {name: dict(kinds) for name, kinds in self.value_types}
        return CallParser(self.syntax, self.names, value_types=types, parallel=self.parallel)


Parts = tuple[tuple[str, str], ...]


class ToolStep:
    """A reply's calls inside the token step: the answer's pieces (from the reasoning split,
    or the token's text) go through the parser; reasoning passes untouched. With `loose`, the
    answer's text is held back while it may still be a bare call (`LooseWatch`)."""

    def __init__(self, calling: ToolCalling) -> None:
        self.parser = calling.parser()
        self.loose = calling.loose
        self.parallel = calling.parallel
        self._watch = LooseWatch() if calling.loose is not None else None
        self._held: list[str] = []

    def take(self, parts: Parts, *, final: bool = False) -> tuple[Parts, tuple[CallDelta, ...]]:
        out: list[tuple[str, str]] = []
        calls: list[CallDelta] = []
        parser = self.parser
        for kind, text in parts:
            if kind != "content":
                if self._held:  # the answer went back to thinking: it is no bare call
                    self._release(out)
                out.append((kind, text))
                continue
            for piece in parser.feed(text):
                self._sort(piece, out, calls)
        if final:
            for piece in parser.finish():
                self._sort(piece, out, calls)
            if self._watch is not None:
                self._read_loose(out, calls)
        return tuple(out), tuple(calls)

    def _sort(self, piece: Piece, out: list[tuple[str, str]], calls: list[CallDelta]) -> None:
        if piece[0] == "content":
            if self._watch is not None:
                self._held.append(piece[1])
                if self._watch.feed(piece[1]):
                    return
                self._release(out)
                return
            _add_content(out, piece[1])
        else:
            if self._watch is not None:  # a call in the family's syntax: none is loose
                self._release(out)
            calls.append(piece[1])

    def _release(self, out: list[tuple[str, str]]) -> None:
        """The held text is no bare call: it is given out, and nothing is held from here on."""
        self._watch = None
        if self._held:
            _add_content(out, "".join(self._held))
            self._held = []

    def _read_loose(self, out: list[tuple[str, str]], calls: list[CallDelta]) -> None:
        """At the reply's end: the held answer as calls, where it is a bare call of an offered
        tool; else as the text it is."""
        parser, loose = self.parser, self.loose
        assert loose is not None
        found = None
        if self._held and not parser.calls and not parser.broken:
            found = loose.read("".join(self._held), parallel=self.parallel)
        if found is None:
            self._release(out)
            return
        self._watch, self._held = None, []
        parser.calls.extend(found)
        parser.content = ""
        for index, call in enumerate(found):
            calls.append(CallDelta(index, name=call.name, arguments=call.arguments))


def _add_content(out: list[tuple[str, str]], text: str) -> None:
    if out and out[-1][0] == "content":
        out[-1] = ("content", out[-1][1] + text)
    else:
        out.append(("content", text))
