"""Reading a call's text as it streams: the primitives `CallParser` (`callparser`) builds on.

`Scanner` holds the text not yet given out and where reading is in it. Its readers are
generators that wait (yield) until enough text has come, raise `Broken` where the text leaves
the syntax and `Ended` where it ends before a call is whole. JSON values are scanned, not
parsed, as they come, so that a call's arguments can be given out while the model writes them
(`_args`, which the parser defines); each is checked with the json module once whole.
"""

from __future__ import annotations

import json
from collections.abc import Generator


class Broken(Exception):
    """The text stopped following the call syntax."""


class Ended(Broken):
    """The text ended inside a call."""


class Scanner:
    """The text being read (`_buf`, from `_pos`), and whether more may come (`_final`)."""

    def __init__(self) -> None:
        self._buf = ""  # text not yet given out as content
        self._pos = 0  # where reading is in `_buf`
        self._final = False
        self._streamed = -1  # where the arguments' text was given up to, while they stream

    def _args(self, text: str) -> None:
        """`text` added to the arguments of the call being read."""
        raise NotImplementedError

    def _need(self, n: int = 1) -> Generator[None, None, None]:
        while len(self._buf) - self._pos < n:
            if self._final:
                raise Ended
            yield

    def _ws(self) -> Generator[None, None, None]:
        while True:
            yield from self._need()
            if not self._buf[self._pos].isspace():
                return
            self._pos += 1

    def _more(self) -> Generator[None, None, bool]:
        """Past whitespace: whether any text follows (False: the reply ended)."""
        while True:
            if self._pos < len(self._buf):
                if not self._buf[self._pos].isspace():
                    return True
                self._pos += 1
                continue
            if self._final:
                return False
            yield

    def _peek_literal(self, literal: str) -> Generator[None, None, bool]:
        """Whether `literal` comes next (after whitespace); taken if so."""
        literal = literal.strip()
        if not literal:
            return True
        if not (yield from self._more()):
            return False
        while True:
            have = self._buf[self._pos : self._pos + len(literal)]
            if not literal.startswith(have):
                return False
            if len(have) == len(literal):
                self._pos += len(literal)
                return True
            if self._final:  # the text ends with the literal's beginning
                raise Ended
            yield

    def _literal(self, literal: str) -> Generator[None, None, None]:
        if literal.strip() and not (yield from self._more()):
            raise Ended
        if not (yield from self._peek_literal(literal)):
            raise Broken

    def _until(self, marker: str, limit: int) -> Generator[None, None, str]:
        """The text up to `marker` (taken too); no more than `limit` characters. (Whitespace
        around the marker is not its own, unless it is nothing but whitespace: a line break.)"""
        marker = marker.strip() or marker
        while True:
            at = self._buf.find(marker, self._pos)
            if at >= 0:
                text = self._buf[self._pos : at]
                if len(text) > limit:
                    raise Broken
                self._pos = at + len(marker)
                return text
            if len(self._buf) - self._pos > limit + len(marker):
                raise Broken
            if self._final:
                raise Ended
            yield

    def _json_string(self) -> Generator[None, None, str]:
        yield from self._need()
        if self._buf[self._pos] != '"':
            raise Broken
        start = self._pos
        yield from self._skip_string()
        try:
            value = json.loads(self._buf[start : self._pos])
        except ValueError:
            raise Broken from None
        if not isinstance(value, str):
            raise Broken
        return value

    def _skip_string(self) -> Generator[None, None, None]:
        """Past a JSON string (at its opening quote)."""
        opening = self._pos
        self._pos += 1
        while True:
            yield from self._need()
            buf = self._buf
            quote = buf.find('"', self._pos)
            if quote < 0:
                self._pos = len(buf)
                self._stream_args()
                if self._final:
                    raise Ended
                yield
                continue
            backslashes = 0
            while quote - 1 - backslashes > opening and buf[quote - 1 - backslashes] == "\\":
                backslashes += 1
            self._pos = quote + 1
            if backslashes % 2 == 0:
                return

    def _json_value(self, *, stream: bool) -> Generator[None, None, str]:
        """A whole JSON value (its text); with `stream` its text is given as arguments as it
        comes. Checked with the json module once whole."""
        yield from self._need()
        start = self._pos
        first = self._buf[start]
        if first == '"':
            yield from self._skip_string()
        elif first in "{[":
            yield from self._container(stream)
        else:  # a number or a literal: up to a delimiter
            while True:
                yield from self._need()
                if self._buf[self._pos] in ",}] \t\r\n<`[":
                    break
                self._pos += 1
        text = self._buf[start : self._pos]
        try:
            json.loads(text)
        except ValueError:
            raise Broken from None
        if stream and first not in "{[":
            self._args(text)
        return text

    def _container(self, stream: bool) -> Generator[None, None, None]:
        """Past a JSON object or array (at its opening bracket), its text given as arguments as
        it comes with `stream` (a long string in it too, piece by piece)."""
        if stream:
            self._streamed = self._pos
        depth = 0
        try:
            while True:
                yield from self._need()
                ch = self._buf[self._pos]
                if ch == '"':
                    yield from self._skip_string()
                else:
                    self._pos += 1
                    if ch in "{[":
                        depth += 1
                    elif ch in "}]":
                        depth -= 1
                self._stream_args()
                if depth == 0:
                    return
        finally:
            self._streamed = -1

    def _stream_args(self) -> None:
        """The arguments' text scanned since they were last given, while they stream."""
        if self._streamed >= 0 and self._pos > self._streamed:
            self._args(self._buf[self._streamed : self._pos])
            self._streamed = self._pos


def partial_tail(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
