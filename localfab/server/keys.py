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
        raw = _given(headers)
        ok = False
        for key in self._keys:  # compare against every key: time does not reveal which matched
            ok |= hmac.compare_digest(raw, key)
        return ok

    def owner(self, headers: Headers) -> int | None:
        """Which key the request carries (its index), for what belongs to a key's holder
        (resumable streams); -1 for none, and None when there are fewer than two keys (then
        every request is the one holder's)."""
        if len(self._keys) < 2:
            return None
        raw = _given(headers)
        which = -1
        for index, key in enumerate(self._keys):  # every key compared, as in __call__
            if hmac.compare_digest(raw, key):
                which = index
        return which


def _given(headers: Headers) -> bytes:
    """The key a request sends, as its bytes (Headers decoded latin-1)."""
    given = headers.get("authorization", "")
    if not given:
        given = headers.get("x-api-key", "")
    if given.startswith("Bearer "):
        given = given[len("Bearer ") :]
    return given.encode("latin-1")
