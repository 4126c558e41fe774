"""Rules at the server's edge: which Host names and browser origins it answers, where API keys
come from, and strings a request body must not hold. Pure functions, no web framework.

A server bound to a loopback address answers only requests addressed to a loopback name, so a
web page cannot reach it through DNS rebinding (a name of the attacker's that resolves to
127.0.0.1). Browsers may read answers only from pages on loopback origins unless the user names
more, as Ollama's OLLAMA_ORIGINS does: `--allowed-origins` / LOCALFAB_ORIGINS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localfab.errors import UsageError

ORIGINS_ENV = "LOCALFAB_ORIGINS"
API_KEY_ENV = "LLAMA_API_KEY"

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_loopback_name(name: str) -> bool:
    """`localhost` or a loopback IP address (127.0.0.0/8, ::1), without port or brackets."""
    name = name.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header without its port: `[::1]:8080` -> `::1`, `a:80` -> `a`."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return ""
        return header[1:end]
    name, colon, port = header.partition(":")
    if colon and not port.isdigit():
        return ""
    return name


def host_allowed(header: str | None) -> bool:
    """Whether a request's Host header names this machine by a loopback name or address.

    A request without a Host header (HTTP/1.0) passes: browsers always send one.
    """
    return header is None or is_loopback_name(host_name(header))


def split_origins(values: Iterable[str]) -> tuple[str, ...]:
    """Origin patterns from flag or environment values, each a comma-separated list."""
    patterns: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in ("*", "null") and "://" not in part:
                raise UsageError(
                    f"allowed origin {part!r} is not an origin: write scheme://host[:port], "
                    "e.g. https://app.example.com or http://*.example.com, or * for any origin"
                )
            patterns.append(part.rstrip("/"))
    return tuple(patterns)


def is_loopback_origin(origin: str) -> bool:
    """`http(s)://` localhost, 127.x.x.x or [::1], with any port."""
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return False
    return parts.hostname is not None and is_loopback_name(parts.hostname)


class OriginRule:
    """Which browser origins may read answers: loopback ones, the same origin, and `patterns`.

    A pattern is an origin with `*` standing for any run of characters
    (`https://*.example.com`, `chrome-extension://*`); `*` alone allows every origin.
    """

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self.patterns = tuple(patterns)
        self.any = "*" in self.patterns
        self._regexes = [
            re.compile("".join(".*" if c == "*" else re.escape(c) for c in p), re.IGNORECASE)
            for p in self.patterns
        ]

    def allows(self, origin: str, host: str | None = None) -> bool:
        if self.any or is_loopback_origin(origin):
            return True
        scheme, sep, rest = origin.partition("://")
        if sep and host is not None and rest.lower() == host.lower():
            return True  # the page came from this server itself: not a cross-origin read
        return any(r.fullmatch(origin) for r in self._regexes)


def read_key_file(path: str | Path) -> tuple[str, ...]:
    """API keys from a file: one a line, surrounding whitespace and blank lines ignored."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"--api-key-file {path}: cannot read it ({reason}); give a readable file "
            "with one key a line"
        ) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"--api-key-file {path}: not UTF-8 text; write one key a line") from exc
    keys = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise UsageError(f"--api-key-file {path} holds no key: write one key a line")
    return keys


def lone_surrogate(data: Any) -> tuple[str, str] | None:
    """Where parsed JSON holds a lone UTF-16 surrogate (`"\\ud800"`), and which one.

    JSON may spell one, but it is not Unicode text: it cannot be encoded as UTF-8, so the
    tokenizer, templates and grammars cannot take it. Returns (where, `\\uXXXX`) or None.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                return _where(path), f"\\u{ord(found.group()):04x}"
        elif isinstance(value, dict):
            for key, item in value.items():
                found = _SURROGATE.search(key)
                if found:
                    return f"a key in {_where(path)}", f"\\u{ord(found.group()):04x}"
                if isinstance(item, str | dict | list):
                    stack.append((item, (*path, key)))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str | dict | list):
                    stack.append((item, (*path, i)))
    return None


def _where(path: tuple[str | int, ...]) -> str:
    if not path:
        return "the body"
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return f"'{out}'"
