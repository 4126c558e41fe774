"""Tool calls in a reply: one streaming parser for every model family's call syntax.

A chat template writes a model's tool calls in its own markers: Hermes, Qwen2.5 and Qwen3 a JSON
object in `<tool_call>` ... `</tool_call>`, Mistral Nemo a JSON array after `[TOOL_CALLS]`,
Ministral and Devstral `[TOOL_CALLS]name[ARGS]{...}`, DeepSeek R1 the name between its
tool-call tokens and the arguments in a fenced JSON block, Qwen3-Coder `<function=NAME>` with
one `<parameter=K>` tag per argument, and so on. `CallSyntax` describes any of these with a few
strings (the chat layer reads them off the template itself, see `chat.tools`); `CallParser`
reads a reply's answer text as it streams and separates its calls from its content:

- "json": each call is a JSON object holding the name and the arguments under two keys (and an
  id under a third, where the family writes one); several may sit in one JSON array.
- "tagged": the name is bare text up to `name_end`, the arguments a JSON object after it.
- "xml": the name as in "tagged", then one key/value pair of tags per argument; the values are
  raw text, made JSON by the tool's schema (`value_types`).

Text before, between and after calls is content. The name of a call is given once it is whole
(and known, when the tools are named); its arguments stream as the model writes them (the
model's own JSON text, as llama-server gives them). Output that breaks the syntax is content,
never an error: a call whose name is unknown or whose JSON does not parse is given back as the
text it was, where none of it was given as a call yet. Markers are matched with any whitespace
around them, since models put newlines where templates do not.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Literal

from localfab.engine.callsyntax import MAX_NAME, Call, CallDelta, CallSyntax, typed_value


class _Broken(Exception):
    """The text stopped following the call syntax."""


Piece = tuple[Literal["content"], str] | tuple[Literal["call"], CallDelta]


@dataclass
class _Region:
    """The calls section being parsed: where its trigger ends in the buffer, the calls there
    were before it, and whether it gave out a call."""

    start: int
    n_calls: int
    emitted: bool = False  # a call of it was given out


class CallParser:
    """Splits a reply's answer into content and tool calls as it streams (module docstring).

    `feed(text)` returns the new pieces: ("content", text) and ("call", CallDelta); `finish()`
    the last ones. `calls` holds the calls so far; `content` the content.
    """

    def __init__(
        self,
        syntax: CallSyntax,
        names: frozenset[str] | None = None,
        *,
        value_types: Mapping[str, Mapping[str, str]] | None = None,
        parallel: bool = True,
    ) -> None:
        self.syntax = syntax
        self.names = names
        self.value_types = value_types or {}
        self.parallel = parallel
        self.calls: list[Call] = []
        self.content = ""
        self.broken = False  # a call was given out and then the text broke the syntax
        self._buf = ""  # text not yet given out as content
        self._pos = 0  # where the parser is in `_buf`
        self._final = False
        self._out: list[Piece] = []
        self._region: _Region | None = None
        self._gen: Generator[None, None, None] | None = None
        self._trigger = syntax.trigger
        self._streamed = -1  # where the arguments' text was given up to, while they stream
        self._n_streamed = 0  # calls given out (dropped ones too)
        self._index = 0  # the stream's index of the call being read

    # --- the public side ---------------------------------------------------------------------

    def feed(self, text: str) -> list[Piece]:
        if text:
            self._buf += text
            self._run()
        return self._take()

    def finish(self) -> list[Piece]:
        self._final = True
        self._run()
        while self._region is not None:  # the text ended inside a call
            self._give_up()
            self._run()
        if self._buf:
            self._content(self._buf)
            self._buf, self._pos = "", 0
        return self._take()

    def _take(self) -> list[Piece]:
        out, self._out = self._out, []
        return out

    # --- content, and where calls begin ------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._region is None and not self._find_trigger():
                return
            if not self._step_calls():
                return

    def _find_trigger(self) -> bool:
        """Give out the content before the next trigger; True when one starts a region."""
        buf, trigger = self._buf, self._trigger
        if trigger:
            at = buf.find(trigger)
        elif self.content or self.calls or buf.lstrip()[:1] not in ("", "{"):
            at = -1  # a marker-less call is the whole answer; this one is not
            trigger = "\x00"  # nothing is held back for it any more
        else:
            at = len(buf) - len(buf.lstrip()) if buf.strip() else -1
            trigger = "{"
        if at < 0:
            keep = 0 if self._final else _partial_tail(buf, trigger)
            cut = len(buf) - keep
            if self.calls and not buf[:cut].strip():
                # Whitespace after calls is not content (unless text follows it).
                if self._final:
                    self._buf = ""
                return False
            if cut:
                self._content(buf[:cut])
                self._buf = buf[cut:]
            return False
        if at:
            self._content(buf[:at])
        self._buf = buf[at:]
        self._pos = len(trigger) if self._trigger else 0
        self._region = _Region(self._pos, len(self.calls))
        self._gen = self._calls()
        return True

    def _step_calls(self) -> bool:
        """Run the calls parser on the text there is; True when its region closed."""
        assert self._gen is not None
        try:
            next(self._gen)
        except StopIteration:
            self._buf = self._buf[self._pos :]
            self._pos = 0
            self._region, self._gen = None, None
            return True
        except _Broken:
            self._give_up()
            return True
        return False

    def _give_up(self) -> None:
        """The region broke the syntax (or the text ended inside it). The calls it finished
        stay; one it had begun is dropped (`broken`: its name and arguments were given out
        already); its text is content, and the text after its trigger (or, where it gave out a
        call, after where it broke) is looked at again for calls."""
        region = self._region
        assert region is not None
        self._region, self._gen = None, None
        buf = self._buf
        if len(self.calls) > region.n_calls:
            del self.calls[region.n_calls :]
            self.broken = True
        if not self._trigger:  # a marker-less call is the whole answer: all of it is content
            cut = len(buf)
        elif region.emitted:  # from where the text broke on, it is looked at again
            cut = max(self._pos, 1)
        else:
            cut = region.start
        self._content(buf[:cut])
        self._buf = buf[cut:]
        self._pos = 0

    def _content(self, text: str) -> None:
        if not self.content and not self.calls:  # whitespace the answer starts with goes, as
            text = text.lstrip()  # llama-server's parser drops it
        if text:
            self.content += text
            self._out.append(("content", text))

    # --- the calls region: a generator that waits for text ----------------------------------

    def _need(self, n: int = 1) -> Generator[None, None, None]:
        while len(self._buf) - self._pos < n:
            if self._final:
                raise _Broken
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
            if self._final:
                return False
            yield

    def _literal(self, literal: str) -> Generator[None, None, None]:
        if not (yield from self._peek_literal(literal)):
            raise _Broken

    def _until(self, marker: str, limit: int) -> Generator[None, None, str]:
        """The text up to `marker` (taken too); no more than `limit` characters."""
        marker = marker.strip()
        while True:
            at = self._buf.find(marker, self._pos)
            if at >= 0:
                text = self._buf[self._pos : at]
                if len(text) > limit:
                    raise _Broken
                self._pos = at + len(marker)
                return text
            if len(self._buf) - self._pos > limit + len(marker):
                raise _Broken
            if self._final:
                raise _Broken
            yield

    def _calls(self) -> Generator[None, None, None]:
        s = self.syntax
        region = self._region
        assert region is not None
        if s.section_start.strip() and s.call_start.strip():
            yield from self._literal(s.call_start)
        if s.style == "json" and s.array:
            yield from self._literal("[")
        while True:
            yield from self._one_call()
            if s.call_end:
                yield from self._literal(s.call_end)
            # The calls so far are whole: a break from here on leaves them as they are.
            self._commit()
            region.n_calls = len(self.calls)
            if not self.parallel or not (yield from self._another()):
                break
        if s.style == "json" and s.array:
            yield from self._literal("]")
        if s.section_end:  # often an end-of-turn token, which ends the text unseen
            yield from self._peek_literal(s.section_end)

    def _another(self) -> Generator[None, None, bool]:
        """Whether another call follows (its opening taken)."""
        s = self.syntax
        if s.call_start.strip():
            return (yield from self._peek_literal(s.call_start))
        if not (yield from self._more()):
            return False
        if s.style == "json" and s.array:
            if self._buf[self._pos] != ",":
                return False
            self._pos += 1
            return True
        return self._buf[self._pos] == "{"

    def _commit(self) -> None:
        self._buf = self._buf[self._pos :]
        self._pos = 0
        assert self._region is not None
        self._region.start = 0

    def _one_call(self) -> Generator[None, None, None]:
        s = self.syntax
        if s.style == "json":
            yield from self._json_call()
            return
        name = (yield from self._until(s.id_start or s.name_end, MAX_NAME)).strip()
        call_id = (yield from self._until(s.name_end, MAX_NAME)).strip() if s.id_start else ""
        self._open_call(name, call_id)
        if s.style == "tagged":
            yield from self._ws()
            yield from self._json_value(stream=True)
        else:
            yield from self._xml_args(name)

    def _open_call(self, name: str, call_id: str = "") -> None:
        if not name or len(name) > MAX_NAME or any(c.isspace() for c in name):
            raise _Broken
        if self.names is not None and name not in self.names:
            raise _Broken
        # A stream's index for the call: never one a dropped call had (`broken`).
        self._index = self._n_streamed
        self._n_streamed += 1
        self.calls.append(Call(name, "", call_id))
        assert self._region is not None
        self._region.emitted = True
        self._out.append(("call", CallDelta(self._index, name=name, id=call_id)))

    def _args(self, text: str) -> None:
        if text:
            call = self.calls[-1]
            call.arguments += text
            self._out.append(("call", CallDelta(self._index, arguments=text)))

    # --- JSON ----------------------------------------------------------------------------------

    def _json_call(self) -> Generator[None, None, None]:
        """One call object: its name, id and arguments among its keys, in any order."""
        yield from self._ws()
        if self._buf[self._pos] != "{":
            raise _Broken
        self._pos += 1
        found: dict[str, str] = {}  # the name, the id, and arguments written before the name
        while True:
            yield from self._ws()
            if self._buf[self._pos] == "}":
                self._pos += 1
                break
            key = yield from self._json_string()
            yield from self._ws()
            if self._buf[self._pos] != ":":
                raise _Broken
            self._pos += 1
            yield from self._ws()
            yield from self._json_member(key, found)
            yield from self._ws()
            if self._buf[self._pos] == ",":
                self._pos += 1
        if "name" not in found:
            raise _Broken

    def _json_member(self, key: str, found: dict[str, str]) -> Generator[None, None, None]:
        """One key's value in a call object."""
        s = self.syntax
        named = "name" in found
        if key == s.name_key and not named:
            found["name"] = yield from self._json_string()
            self._open_call(found["name"], found.get("id", ""))
            self._args(found.pop("args", ""))
        elif key == s.args_key:
            if named:
                yield from self._json_value(stream=True)
            else:
                found["args"] = yield from self._json_value(stream=False)
        elif key == s.id_key and s.id_key:
            found["id"] = yield from self._json_string()
            if named:
                self.calls[-1].id = found["id"]
                self._out.append(("call", CallDelta(self._index, id=found["id"])))
        else:
            yield from self._json_value(stream=False)

    def _json_string(self) -> Generator[None, None, str]:
        yield from self._need()
        if self._buf[self._pos] != '"':
            raise _Broken
        start = self._pos
        yield from self._skip_string()
        try:
            value = json.loads(self._buf[start : self._pos])
        except ValueError:
            raise _Broken from None
        if not isinstance(value, str):
            raise _Broken
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
            raise _Broken from None
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

    # --- XML-style arguments -------------------------------------------------------------------

    def _xml_args(self, name: str) -> Generator[None, None, None]:
        s = self.syntax
        types = self.value_types.get(name, {})
        opened = False
        while (yield from self._peek_literal(s.key_start)):
            key = (yield from self._until(s.key_end, MAX_NAME)).strip()
            value = yield from self._until(s.value_end, 1 << 24)
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            piece = json.dumps(key, ensure_ascii=False) + ":" + typed_value(value, types.get(key))
            self._args(("," if opened else "{") + piece)
            opened = True
        self._args("}" if opened else "{}")


def _partial_tail(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
