"""The API key check of `--api-key`: what a request sends, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers


class KeyCheck:
    """The API keys, compared in constant time against what a request sends."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        # Undecodable bytes from argv or the environment come back as they were given.
        self._keys = [k.encode("utf-8", "surrogateescape") for k in keys]

    def __call__(self, headers: Headers) -> bool:
        given = headers.get("authorization", "")
        if not given:
            given = headers.get("x-api-key", "")
        if given.startswith("Bearer "):
            given = given[len("Bearer ") :]
        raw = given.encode("latin-1")  # the header's bytes as sent (Headers decoded latin-1)
        ok = False
        for key in self._keys:  # compare against every key: time does not reveal which matched
            ok |= hmac.compare_digest(raw, key)
        return ok
