"""The gate in front of every route: Host, CORS, OPTIONS, loading state and the API key.

It does what llama-server's pre-routing handler does, in its order, after two checks of its own.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localfab.server.edge import OriginRule, host_allowed
from localfab.server.errors import ApiError
from localfab.server.plumbing import JSON_TYPE, send_simple

if TYPE_CHECKING:
    from localfab.server.settings import ServerSettings

log = logging.getLogger("localfab.server")


class Guarded(Protocol):
    """What the gate reads of the server behind it (a model's, or the router)."""

    settings: ServerSettings
    worker: Any  # ready, load_error, sleeping, sleep_lock, in_flight, last_activity
    info: Any  # None while the model loads
    key_ok: Any  # headers -> whether they carry a valid key

    async def wake(self) -> None: ...


PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# What a sleeping server answers without loading its model again (llama-server's read-only
# endpoints, by method and path).
READ_ONLY = frozenset(
    {
        ("GET", p)
        for p in ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/slots")
    }
    # Resumable streams read and stop what is kept: no model needed (as llama-server).
    | {("GET", "/v1/stream"), ("DELETE", "/v1/stream"), ("POST", "/v1/streams/lookup")}
)
CORS_METHODS = "GET, POST, DELETE, OPTIONS"


class Gate:
    """Pure ASGI middleware doing what llama-server's pre-routing handler does, in its order,
    after two checks of its own: the Host name on a loopback bind, and the browser origin.

    llama-server echoes any Origin; here only loopback origins, the server's own origin and
    those named in `settings.allowed_origins` get CORS headers, and a request from any other
    origin is refused with 403, so a web page cannot read answers or start generations.
    """

    def __init__(self, app: ASGIApp, server: Guarded) -> None:
        self.app = app
        self.server = server
        self.origins = OriginRule(server.settings.allowed_origins)

    def _refusal(
        self, headers: Headers
    ) -> tuple[int, bytes, str, list[tuple[bytes, bytes]]] | None:
        """The 403 for a Host that is not a loopback name on a loopback bind (DNS rebinding),
        or for an Origin not allowed; None when the request may go on."""
        host = headers.get("host")
        if self.server.settings.check_host and not host_allowed(host):
            log.warning("refused a request for host %r", host)
            err = ApiError(
                f"Host {host!r} is not a loopback name: this server listens on a loopback "
                "address and answers only requests for localhost, 127.0.0.1 or [::1] "
                "(a guard against DNS rebinding); use one of those in the URL, or listen on "
                "another address with --host (and set --api-key)",
                "permission_error",
            )
            return err.code, err.body(), JSON_TYPE, []
        origin = headers.get("origin")
        if origin is not None and not self.origins.allows(origin, host):
            log.warning("refused a request from origin %r", origin)
            err = ApiError(
                f"origin {origin!r} may not use this server: start it with "
                f"--allowed-origins {origin} (or set LOCALFAB_ORIGINS), or '*' for any "
                "origin",
                "permission_error",
            )
            return err.code, err.body(), JSON_TYPE, [(b"vary", b"Origin")]
        return None

    def _origin_only(self, headers: Headers) -> bool:
        """Whether the only thing refused is the Origin (the Host is fine)."""
        host = headers.get("host")
        return not (self.server.settings.check_host and not host_allowed(host))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        preflight = scope["method"] == "OPTIONS"
        if refusal is not None and preflight and self._origin_only(headers):
            # A preflight from an origin not allowed: answered, without CORS headers (as
            # llama-server's --cors-origins), so the browser sends nothing after it.
            await send_simple(send, 200, b"", "text/html", [(b"vary", b"Origin")])
            return
        if refusal is not None:
            await send_simple(send, *refusal)
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            cors += [
                (b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
            ]
        if preflight:
            if origin is not None:
                cors.append((b"Access-Control-Allow-Credentials", b"true"))
            cors += [
                (b"Access-Control-Allow-Methods", CORS_METHODS.encode()),
                (b"Access-Control-Allow-Headers", b"*"),
            ]
            await send_simple(send, 200, b"", "text/html", cors)
            return
        worker = self.server.worker
        if not worker.ready.is_set() or self.server.info is None:
            err = ApiError("Loading model", "unavailable_error")
            await send_simple(send, err.code, err.body(), JSON_TYPE, cors)
            return
        if worker.load_error is not None:  # the model went to sleep and did not come back
            err = ApiError(
                f"the model could not be loaded again: {worker.load_error}", "unavailable_error"
            )
            await send_simple(send, err.code, err.body(), JSON_TYPE, cors)
            return
        if (
            self.server.settings.api_keys
            and scope["path"] not in PUBLIC_PATHS
            and not self.server.key_ok(headers)
        ):
            log.warning("unauthorized: Invalid API Key")
            err = ApiError("Invalid API Key", "authentication_error")
            await send_simple(send, err.code, err.body(), JSON_TYPE, cors)
            return

        if (scope["method"], scope["path"]) in READ_ONLY:
            await self._pass(scope, receive, send, cors)
            return
        await self._awake(scope, receive, send, cors)

    async def _awake(
        self, scope: Scope, receive: Receive, send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        """Pass a request on with the model in memory: counted in (the worker does not sleep
        while one is handled), after waking a sleeping model (--sleep-idle-seconds)."""
        worker = self.server.worker
        with worker.sleep_lock:
            worker.in_flight += 1
            worker.last_activity = time.monotonic()
            asleep = worker.sleeping
        try:
            if asleep:
                try:
                    await self.server.wake()
                except ApiError as err:
                    await send_simple(send, err.code, err.body(), JSON_TYPE, cors)
                    return
            await self._pass(scope, receive, send, cors)
        finally:
            with worker.sleep_lock:
                worker.in_flight -= 1
                worker.last_activity = time.monotonic()

    async def _pass(
        self, scope: Scope, receive: Receive, send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + cors
            await send(message)

        await self.app(scope, receive, send_with_cors)
