"""HTTP plumbing shared by every handler: JSON bodies in and out, SSE, the engine-to-loop
channel, disconnect watching and llama-server's error wrapping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from localfab.errors import LocalfabError
from localfab.server.edge import lone_surrogate
from localfab.server.errors import ApiError, api_error, dumps
from localfab.server.params import json_type
from localfab.server.settings import ServerSettings

log = logging.getLogger("localfab.server")

JSON_TYPE = "application/json; charset=utf-8"
_PARSE_INLINE_MAX = 64 * 1024  # bytes of request body parsed on the event loop itself

Handler = Callable[[Request], Awaitable[Response]]


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(dumps(data), status_code=status, media_type=JSON_TYPE, headers=headers)


def error_response(err: ApiError) -> Response:
    return Response(err.body(), status_code=err.code, media_type=JSON_TYPE)


async def send_simple(
    send: Send, status: int, body: bytes, content_type: str, extra: list[tuple[bytes, bytes]]
) -> None:
    """A whole response in two ASGI messages (for middleware answering on its own)."""
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- reading a request ----------------------------------------------------------------------


async def read_json(request: Request, settings: ServerSettings) -> dict[str, Any]:
    """The body as a JSON object, read within the size and time limits."""
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            f"request body of {declared} bytes is larger than the {limit} bytes allowed",
            code=413,
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(settings.read_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(
                        f"request body is larger than the {limit} bytes allowed", code=413
                    )
                chunks.append(chunk)
    except TimeoutError as exc:
        raise ApiError("timed out reading the request body", code=408) from exc
    raw = b"".join(chunks)
    if len(raw) <= _PARSE_INLINE_MAX:
        data = parse_body(raw)
    else:  # a large body takes milliseconds to parse and scan: not on the event loop
        data = await asyncio.to_thread(parse_body, raw)
    if not isinstance(data, dict):
        raise ApiError(f"the request body must be a JSON object, not {json_type(data)}")
    return data


def parse_body(raw: bytes) -> Any:
    """The request body as JSON; ApiError for invalid JSON or a lone surrogate in a string."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(f"invalid JSON in the request body: {exc}") from exc
    bad = lone_surrogate(data)
    if bad is not None:
        where, char = bad
        raise ApiError(
            f"invalid JSON in the request body: {where} holds a lone surrogate ({char}), "
            "which is not Unicode text; send valid UTF-8 (surrogates only in pairs)"
        )
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# --- streaming ------------------------------------------------------------------------------


class EventStream(Response):
    """An SSE response whose chunks come from an async iterator; `on_close` always runs.

    Written as a plain ASGI response (not StreamingResponse) so that nothing else reads
    `receive`: the request's disconnect watcher owns it.
    """

    def __init__(
        self, chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.chunks = chunks
        self.on_close = on_close
        self.raw_headers = [
            (k, v) for k, v in self.raw_headers if k not in (b"content-length", b"content-type")
        ] + [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            pass
        finally:
            await self.on_close()


class Disconnected:
    """What a channel yields once the client has gone away."""


DISCONNECTED = Disconnected()


class Channel:
    """Carries what the engine thread emits for one job to the event loop, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(self, item: Any) -> None:  # called on the engine thread
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def get(self) -> Any:
        return await self.queue.get()


async def watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    """Call `on_disconnect` as soon as the client disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


# --- error wrapping -------------------------------------------------------------------------


def wrap(handler: Handler) -> Handler:
    """llama-server's ex_wrapper: every failure becomes its JSON error body."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except (ApiError, LocalfabError) as exc:
            return error_response(api_error(exc))
        except Exception as exc:
            log.exception("request failed")
            return error_response(api_error(exc))

    return endpoint


async def not_found(request: Request, exc: Exception) -> Response:
    return Response(
        dumps({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}),
        status_code=404,
        media_type=JSON_TYPE,
    )
