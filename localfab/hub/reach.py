"""Is the hub reachable at all? One quick look before the library's retries.

Offline (no route, no name resolution, a mirror that is down), `huggingface_hub` retries a
failed connection five times with growing pauses: `plan` and `pull` took about 24 s to fail
and printed the library's retry lines, and the models screen showed "checking…" for 20 s a
row. Before the first request to an endpoint, this resolves its host (or the proxy's, when one
applies) and opens a TCP connection, each bounded to about a second; a failure becomes one
line that says the machine looks offline and what still works. The answer is kept a short
while per endpoint, so a screen of checks asks once.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from urllib.parse import urlsplit

from localfab.errors import HubUnreachable

RESOLVE_S = 1.0  # name resolution, at most
CONNECT_S = 0.8  # a TCP connection, at most
KEEP_OK_S = 60.0  # a reachable endpoint is not asked again for this long
KEEP_FAILED_S = 5.0  # an unreachable one: short, so that a reconnected machine retries soon

_lock = threading.Lock()
_answers: dict[str, tuple[float, str | None]] = {}


def check_reachable(endpoint: str) -> None:
    """Raise `HubUnreachable` (in about 2 s at most) if `endpoint` cannot be reached."""
    why = unreachable(endpoint)
    if why is not None:
        raise HubUnreachable(
            f"cannot reach {endpoint}: {why}. This machine looks offline (or the mirror in "
            f"HF_ENDPOINT is down): models already on this machine still work (`localfab "
            f"list`, run, chat, serve, plan); try again once connected"
        )


def unreachable(endpoint: str) -> str | None:
    """Why `endpoint` cannot be reached (its host's name or a connection), or None."""
    now = time.monotonic()
    with _lock:
        kept = _answers.get(endpoint)
    if kept is not None and now < kept[0]:
        return kept[1]
    why = _probe(endpoint)
    keep = KEEP_FAILED_S if why is not None else KEEP_OK_S
    with _lock:
        _answers[endpoint] = (time.monotonic() + keep, why)
    return why


def forget() -> None:
    """Ask again next time (a test, or the models screen's "check again")."""
    with _lock:
        _answers.clear()


def _probe(endpoint: str) -> str | None:
    parts = urlsplit(endpoint)
    host = parts.hostname
    if not host:
        return None  # not a URL this can check: let the library say what is wrong
    port = parts.port or (443 if parts.scheme == "https" else 80)
    via = ""
    proxy = _proxy_for(endpoint, parts.scheme)
    if proxy is not None:
        proxy_parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if proxy_parts.hostname:
            host, port = proxy_parts.hostname, proxy_parts.port or 80
            via = " (the proxy)"
    addresses = _resolve(host, port)
    if isinstance(addresses, str):
        return f"the name {host}{via} {addresses}"
    failure = ""
    for family, kind, proto, _, address in addresses[:3]:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(CONNECT_S)
                sock.connect(address)
            return None
        except OSError as exc:
            failure = _describe(exc)
    return f"no connection to {host}:{port}{via} ({failure or 'no address'})"


def _proxy_for(url: str, scheme: str) -> str | None:
    """The proxy the HTTP client would use for `url` (from the environment), if any."""
    host = urlsplit(url).hostname or ""
    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(scheme)


def _resolve(host: str, port: int) -> list[tuple[int, int, int, str, tuple[object, ...]]] | str:
    """The host's addresses, or what went wrong: name resolution may hang on a machine whose
    DNS server is unreachable, so it runs on a thread and is given `RESOLVE_S`."""
    result: list[object] = []

    def resolve() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            result.append(exc)

    worker = threading.Thread(target=resolve, name="hub name resolution", daemon=True)
    worker.start()
    worker.join(RESOLVE_S)
    if not result:
        return f"did not resolve within {RESOLVE_S:.0f} s"
    found = result[0]
    if isinstance(found, OSError):
        return f"does not resolve ({_describe(found)})"
    return found  # type: ignore[return-value]


def _describe(exc: OSError) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return exc.strerror or type(exc).__name__
