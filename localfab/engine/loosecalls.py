"""Tool calls written without their family's markers, as small models write them.

Qwen2.5-Coder 0.5B, asked for a call by a template that wants `<tool_call>` tags, often writes
the JSON object alone, or in a ```json block, and sometimes stops one closing brace short. With
`LooseCalls` (the app and `run` always; `serve` with --tool-call-lenient), a reply that is
nothing but such an object (or a list of them) naming an offered tool, with arguments that fit
its schema, is read as calls once the reply has ended: text the reply left open (a string, a
bracket) is closed first. Anything else stays text: prose around the JSON, a name not offered,
arguments the schema does not take. `LooseWatch` tells, as the reply streams, whether it may
still be such a call, so its text is held back instead of shown and then taken away.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localfab.engine.callsyntax import Call

# Keys a call object may hold its name and its arguments under, besides the family's own.
_NAME_KEYS = ("name",)
_ARGS_KEYS = ("arguments", "parameters")
_FENCE = "```"


@dataclass(frozen=True)
class ArgsShape:
    """What a tool's arguments may be, read off its JSON schema: the keys it requires, and the
    keys it names with their JSON types (() : any type); `properties` None takes any key."""

    required: tuple[str, ...] = ()
    properties: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> ArgsShape:
        required = schema.get("required")
        if not isinstance(required, list):
            required = []
        needed = tuple(k for k in required if isinstance(k, str))
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        # Names the schema lists are the names it takes, unless it says it takes more.
        if extra not in (None, False) or (not isinstance(props, Mapping) and extra is None):
            return cls(needed, None)
        named = []
        for key, sub in (props if isinstance(props, Mapping) else {}).items():
            kind = sub.get("type") if isinstance(sub, Mapping) else None
            kinds = (kind,) if isinstance(kind, str) else kind if isinstance(kind, list) else ()
            named.append((str(key), tuple(str(k) for k in kinds)))
        return cls(needed, tuple(named))

    def fits(self, args: Mapping[str, Any]) -> bool:
        if any(key not in args for key in self.required):
            return False
        if self.properties is None:
            return True
        kinds = dict(self.properties)
        for key, value in args.items():
            if key not in kinds:
                return False
            if kinds[key] and not any(_is(value, kind) for kind in kinds[key]):
                return False
        return True


def _is(value: Any, kind: str) -> bool:
    """Whether `value` (parsed JSON) is of JSON schema type `kind` (an unknown one takes all)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        if isinstance(value, float):
            return value.is_integer()
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True


@dataclass(frozen=True)
class LooseCalls:
    """The offered tools' argument shapes, to read a reply that is a bare call (module
    docstring); `name_key` and `args_key`: the family's own keys, taken besides the usual."""

    shapes: tuple[tuple[str, ArgsShape], ...]
    name_key: str = "name"
    args_key: str = "arguments"

    @classmethod
    def of(
        cls,
        functions: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        name_key: str = "name",
        args_key: str = "arguments",
    ) -> LooseCalls:
        """From (name, parameters schema) of the tools a reply may call."""
        shapes = tuple((name, ArgsShape.of(schema)) for name, schema in functions)
        return cls(shapes, name_key or "name", args_key or "arguments")

    def read(self, text: str, *, parallel: bool = True) -> list[Call] | None:
        """The calls `text` (a whole reply's answer) is; None where it is text."""
        body = _unfenced(text)
        if body is None or body[:1] not in ("{", "["):
            return None
        try:
            value = json.loads(heal(body), strict=False)
        except (ValueError, RecursionError):
            return None
        items = value if isinstance(value, list) else [value]
        if not items or (len(items) > 1 and not parallel):
            return None
        calls = []
        for item in items:
            call = self._call(item)
            if call is None:
                return None
            calls.append(call)
        return calls

    def _call(self, item: Any) -> Call | None:
        if not isinstance(item, dict):
            return None
        function = item.get("function")
        if isinstance(function, dict):  # OpenAI's {"type": "function", "function": {...}}
            if set(item) - {"function", "type", "id"} or item.get("type", "function") != "function":
                return None
            item = function
        name_keys = {self.name_key, *_NAME_KEYS} & set(item)
        args_keys = {self.args_key, *_ARGS_KEYS} & set(item)
        if len(name_keys) != 1 or len(args_keys) > 1 or set(item) - name_keys - args_keys - {"id"}:
            return None
        name = item[name_keys.pop()]
        shape = dict(self.shapes).get(name) if isinstance(name, str) else None
        if shape is None:
            return None
        args = item[args_keys.pop()] if args_keys else {}
        if isinstance(args, str):  # the arguments as JSON text, as OpenAI writes them
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict) or not shape.fits(args):
            return None
        return Call(name, json.dumps(args, ensure_ascii=False))


def _unfenced(text: str) -> str | None:
    """The reply's text without the ```json fence it may be in (None: a fence of another
    language); a fence the reply left open counts as closed."""
    body = text.strip()
    if not body.startswith(_FENCE):
        return body
    head, _, rest = body[len(_FENCE) :].partition("\n")
    if head.strip().lower() not in ("", "json"):
        return None
    rest = rest.rstrip()
    return rest[: -len(_FENCE)].strip() if rest.endswith(_FENCE) else rest.strip()


def heal(text: str) -> str:
    """`text` (JSON the reply may have left unfinished) with its open string and brackets
    closed (a trailing comma dropped first); as it is where nothing was left open."""
    scan = _JsonScan()
    if not scan.feed(text) or (scan.depth == 0 and not scan.in_string):
        return text  # closed, or not JSON (the parse says so)
    if scan.in_string:
        text = (text[:-1] if scan.escaped else text) + '"'
    text = text.rstrip()
    if text.endswith(","):
        text = text[:-1]
    return text + "".join(reversed(scan.closers))


class _JsonScan:
    """Where JSON text stands as it comes: the brackets open (and what closes each), whether
    it is inside a string (just after a backslash there)."""

    def __init__(self) -> None:
        self.closers: list[str] = []
        self.in_string = self.escaped = False

    @property
    def depth(self) -> int:
        return len(self.closers)

    def feed(self, text: str) -> bool:
        """False where a bracket closes one it does not match."""
        return all(self.step(ch) for ch in text)

    def step(self, ch: str) -> bool:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.closers.append("}" if ch == "{" else "]")
        elif ch in "}]":
            return bool(self.closers) and self.closers.pop() == ch
        return True


class LooseWatch:
    """Follows a reply's answer as it streams: `feed` says whether all of it so far may yet be
    one bare call (or a list of them), bare or in a ```json fence; once it says False, it
    stays False. Only the shape is followed here; names and arguments are checked at the end."""

    def __init__(self) -> None:
        self._state = "start"  # start, fence, body, json, after, closing, done, no
        self._fenced = False
        self._fence = ""  # the fence's opening line so far, then its closing backticks
        self._scan = _JsonScan()
        self._expect = ""  # the next non-space character must be one of these ("": any)

    def feed(self, text: str) -> bool:
        for ch in text:
            if not self._step(ch):
                self._state = "no"
                return False
        return self._state != "no"

    def _step(self, ch: str) -> bool:
        state = self._state
        if state == "json":
            return self._json(ch)
        if state == "fence":
            return self._opening(ch)
        if ch.isspace():
            return state != "no"
        if state == "start" and ch == "`":
            self._state, self._fenced, self._fence = "fence", True, ch
            return True
        if state in ("start", "body") and ch in "{[":
            self._state = "json"
            self._expect = '"}' if ch == "{" else "{"
            return self._scan.step(ch)
        return self._closing(ch)

    def _opening(self, ch: str) -> bool:
        """A character of the fence's opening line: its backticks, then `json` (or nothing)."""
        if len(self._fence) < len(_FENCE):
            self._fence += ch
            return ch == "`"
        language = self._fence[len(_FENCE) :].strip().lower()
        if ch == "\n":
            self._state = "body"
            return language in ("", "json")
        self._fence += ch
        return "json".startswith(self._fence[len(_FENCE) :].strip().lower())

    def _closing(self, ch: str) -> bool:
        """A character after the JSON: only the fence's closing backticks may come."""
        if not self._fenced or ch != "`":
            return False
        if self._state == "after":
            self._state, self._fence = "closing", ch
            return True
        if self._state == "closing":
            self._fence += ch
            if len(self._fence) == len(_FENCE):
                self._state = "done"
            return True
        return False

    def _json(self, ch: str) -> bool:
        scan = self._scan
        if not scan.in_string and self._expect and not ch.isspace():
            # Just inside the outermost bracket: a call object, or a list of them.
            if ch not in self._expect:
                return False
            self._expect = ""
        if not scan.step(ch):
            return False
        if scan.depth == 0:
            self._state = "after"
        return True
