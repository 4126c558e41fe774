"""Tool calls in a reply: one streaming parser for every model family's call syntax.

A chat template writes a model's tool calls in its own markers; `CallSyntax` describes them with
a few strings (the styles are in `callsyntax`; the chat layer reads them off the template,
`chat.toolsyntax`). `CallParser` reads a reply's answer as it streams and separates its calls
from its content.

Text before, between and after calls is content. The name of a call is given once it is whole
(and known, when the tools are named); its arguments stream as the model writes them (the
model's own JSON text, as llama-server gives them). Output that breaks the syntax is content,
never an error: a call whose name is unknown or whose JSON does not parse is given back as the
text it was, where none of it was given as a call yet; a reply cut inside a call keeps it as far
as it goes. Markers are matched with any whitespace around them.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Literal

from localfab.engine.callscan import Broken, Ended, Scanner, partial_tail
from localfab.engine.callsyntax import MAX_NAME, Call, CallDelta, CallSyntax, typed_value

Piece = tuple[Literal["content"], str] | tuple[Literal["call"], CallDelta]


@dataclass
class _Region:
    """The calls section being parsed: where its trigger ends in the buffer, the calls there
    were before it, and whether it gave out a call."""

    start: int
    n_calls: int
    emitted: bool = False  # a call of it was given out


class CallParser(Scanner):
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
        super().__init__()
        self.syntax = syntax
        self.names = names
        self.value_types = value_types or {}
        self.parallel = parallel
        self.calls: list[Call] = []
        self.content = ""
        self.broken = False  # a call was given out and then the text broke the syntax
        self._out: list[Piece] = []
        self._region: _Region | None = None
        self._gen: Generator[None, None, None] | None = None
        self._trigger = syntax.trigger
        self._n_streamed = 0  # calls given out (dropped ones too)
        self._index = 0  # the stream's index of the call being read
        self._said = False  # content was given out after the last call
        if syntax.opened:  # the prompt wrote the trigger: the reply starts inside the calls
            self._region = _Region(0, 0)
            self._gen = self._calls()

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
        start = len(trigger)  # where the region's text starts, in the buffer from `at`
        if trigger:
            at = buf.find(trigger)
        elif self.content or self.calls:
            at = -1  # a marker-less call is the whole answer; this one is not
            trigger = "\x00"  # nothing is held back for it any more
        else:
            body = self._after_lead(buf)
            if body is None:
                return False  # it may be the marker before a call: wait
            at, start = (0, len(buf) - len(body)) if body[:1] == "{" else (-1, 0)
            trigger = "\x00" if body else "{"
        if at < 0:
            keep = 0 if self._final else partial_tail(buf, trigger)
            cut = len(buf) - keep
            if self.calls and not self._said and not buf[:cut].strip():
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
        self._pos = start
        self._region = _Region(self._pos, len(self.calls))
        self._gen = self._calls()
        return True

    def _after_lead(self, buf: str) -> str | None:
        """A marker-less call's text: `buf` past whitespace and the marker that may lead it
        (Llama's `<|python_tag|>`); None while `buf` may yet be that marker."""
        body = buf.lstrip()
        lead = self.syntax.lead
        if lead and body.startswith(lead):
            body = body[len(lead) :].lstrip()
            return None if not body and not self._final else body
        if lead and body and lead.startswith(body) and not self._final:
            return None
        return body

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
        except Ended:
            self._cut_short()
            return True
        except Broken:
            self._give_up()
            return True
        return False

    def _cut_short(self) -> None:
        """The text ended inside a call (cut at the token limit): the calls, the one being
        written too, stay, the rest goes (as llama-server has it); without a call, content."""
        if not self.calls:
            self._give_up()
            return
        self._region, self._gen = None, None
        self._buf, self._pos = "", 0

    def _give_up(self) -> None:
        """The region broke the syntax. The calls it finished stay; one it had begun is dropped
        (`broken`: its name and arguments were given out already); its text is content, and
        the text after its trigger (or after where it broke) is looked at again for calls."""
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
            self._said = bool(self.calls)

    # --- the calls region: a generator that waits for text (reading as in `callscan`) --------

    def _calls(self) -> Generator[None, None, None]:
        s = self.syntax
        region = self._region
        assert region is not None
        if s.section_start.strip() and s.call_start.strip():
            yield from self._literal(s.call_start)
        if s.style == "json" and s.array:
            yield from self._literal("[")
        while True:
            if not (yield from self._one_call()):
                return  # what follows is content, up to the next trigger
            if s.call_end:
                yield from self._literal(s.call_end)
            # The calls so far are whole: a break from here on leaves them as they are.
            self._buf, self._pos = self._buf[self._pos :], 0
            region.start, region.n_calls = 0, len(self.calls)
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

    def _one_call(self) -> Generator[None, None, bool]:
        """One call; False where the "call" is content (to `content_name`)."""
        s = self.syntax
        if s.style == "json":
            yield from self._json_call()
            return True
        name = (yield from self._until(s.id_start or s.name_end, MAX_NAME)).strip()
        if name == s.content_name and name:
            return False
        call_id = (yield from self._until(s.name_end, MAX_NAME)).strip() if s.id_start else ""
        self._open_call(name, call_id)
        if s.style == "tagged":
            yield from self._ws()
            yield from self._json_value(stream=True)
        else:
            yield from self._xml_args(name)
        return True

    def _open_call(self, name: str, call_id: str = "") -> None:
        if not name or len(name) > MAX_NAME or any(c.isspace() for c in name):
            raise Broken
        if self.names is not None and name not in self.names:
            raise Broken
        # A stream's index for the call: never one a dropped call had (`broken`).
        self._index = self._n_streamed
        self._n_streamed += 1
        self.calls.append(Call(name, "", call_id))
        self._said = False
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
            raise Broken
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
                raise Broken
            self._pos += 1
            yield from self._ws()
            yield from self._json_member(key, found)
            yield from self._ws()
            if self._buf[self._pos] == ",":
                self._pos += 1
        if "name" not in found:
            raise Broken

    def _json_member(self, key: str, found: dict[str, str]) -> Generator[None, None, None]:
        """One key's value in a call object."""
        s = self.syntax
        named = "name" in found
        if key == s.name_key and not named:
            found["name"] = yield from self._json_string()
            self._open_call(found["name"], found.get("id", ""))
            self._args(found.pop("args", ""))
        elif key == s.args_key:
            if found.get("had_args"):  # a second arguments key: not a call
                raise Broken
            found["had_args"] = "1"
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

    # --- XML-style arguments -------------------------------------------------------------------

    def _xml_args(self, name: str) -> Generator[None, None, None]:
        s = self.syntax
        types = self.value_types.get(name, {})
        opened = False
        while True:
            if not (yield from self._more()):
                if s.call_end.strip():  # cut before the call's end
                    raise Ended
                break
            if not (yield from self._peek_literal(s.key_start)):
                break
            key = (yield from self._until(s.key_end, MAX_NAME)).strip()
            head = ("," if opened else "{") + json.dumps(key, ensure_ascii=False) + ":"
            opened = True
            if types.get(key) == "string":  # streamed as it comes (a file's text, say)
                self._args(head + '"')
                yield from self._stream_value(s.value_end)
                self._args('"')
                continue
            value = yield from self._until(s.value_end, 1 << 24)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            self._args(head + typed_value(value, types.get(key)))
        self._args("}" if opened else "{}")

    def _stream_value(self, end: str) -> Generator[None, None, None]:
        """A string value's raw text up to `end` (taken too), given as JSON string text as it
        comes; a newline just after the opening tag and one just before `end` are not in it."""
        end = end.strip()
        yield from self._need()
        if self._buf[self._pos] == "\n":
            self._pos += 1
        while True:
            at = self._buf.find(end, self._pos)
            stop = at if at >= 0 else len(self._buf) - partial_tail(self._buf, end)
            if self._buf[self._pos : stop].endswith("\n"):
                stop -= 1  # before `end` it goes; elsewhere it waits to see
            if stop > self._pos:
                self._args(json.dumps(self._buf[self._pos : stop], ensure_ascii=False)[1:-1])
                self._pos = stop
            if at >= 0:
                self._pos = at + len(end)
                return
            if self._final:
                raise Ended
            yield
