"""Streaming text helpers: UTF-8 that never breaks a character, and stop strings across tokens."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Stream:
    """Turns token byte pieces into text, holding back an incomplete UTF-8 sequence.

    A token may end in the middle of a multi-byte character (Chinese, emoji); its bytes wait
    for the next token instead of being shown as a replacement character.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)

    def pending(self) -> bytes:
        """Bytes of an incomplete character waiting for the rest of it."""
        return bytes(self._decoder.getstate()[0])


class StopMatcher:
    """Finds stop strings in streamed text, even when they span several tokens.

    Text that could still be the start of a stop string is held back until it is clearly not.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add text; return what can be shown now. After a match, `matched` is set."""
        if not self.stops:
            return text
        buf = self._pending + text
        first: tuple[int, str] | None = None
        for stop in self.stops:
            i = buf.find(stop)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, stop)
        if first is not None:
            self.matched = first[1]
            self._pending = ""
            return buf[: first[0]]
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), 0, -1):
                if buf.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
