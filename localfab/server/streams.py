"""Resumable streams, as llama-server keeps them (tools/server/server-stream.cpp).

A streamed generation request that carries `X-Conversation-Id` is detached from its client:
its events go into a session kept under that id, the reply goes on when the client drops (a
page reload, a lost network), and the client reads them back from any byte offset with
`GET /v1/stream?conv_id=ID&from=N` (the replay, then the live events until the reply ends).
`DELETE /v1/stream?conv_id=ID` is the user's Stop: the reply is cancelled and its session
forgotten. `POST /v1/streams/lookup` tells a client about the ids it names, never others.

One conversation has at most one session: a new request under the same id cancels the one
before. A session keeps its last 4 MiB of events and is forgotten 5 minutes after its reply
ended. The conversation id travels in the query string because it may hold a model name with
slashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from localfab.server.errors import ApiError
from localfab.server.plumbing import EventStream, json_response, read_json
from localfab.server.shapes import sse

HEADER = "x-conversation-id"
LOST = {
    "code": 400,
    "message": "Stream offset lost, please restart",
    "type": "invalid_request_error",
}
MAX_BYTES = 4 * 1024 * 1024  # the events a session keeps (older ones are dropped)
TTL_SECONDS = 300  # how long a finished session stays readable
WAKE_SECONDS = 0.2  # a waiting reader looks at its client this often


def conv_id(request: Request) -> str:
    """The request's conversation id ('' when it has none)."""
    return request.headers.get(HEADER, "")


class Session:
    """The events of one reply: appended by its producer, read from any offset by readers."""

    def __init__(self, conversation_id: str, cap: int = MAX_BYTES) -> None:
        self.conversation_id = conversation_id
        self.started = int(time.time())
        self.completed = 0  # unix seconds once the reply ended
        self.cap = cap
        self.buffer = bytearray()
        self.dropped = 0  # bytes dropped from the front to stay within the cap
        self.done = False
        self.cancelled = False
        self.producer: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()  # the Stop (or a newer request) came
        self.reply_closed = False  # the reply it keeps was closed (its jobs ended)
        self._wake = asyncio.Event()

    @property
    def total(self) -> int:
        return self.dropped + len(self.buffer)

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self.buffer += data
        over = len(self.buffer) - self.cap
        if over > 0:
            del self.buffer[:over]
            self.dropped += over
        self._notify()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.completed = int(time.time())
            self._notify()

    def cancel(self) -> None:
        """The Stop: the producer is cancelled (and with it the reply), readers end."""
        self.cancelled = True
        self.stopped.set()
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
        self.finish()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def read(self, offset: int, gone: Callable[[], bool]) -> AsyncIterator[bytes]:
        """The events from byte `offset` on: what is kept, then what comes until the reply
        ends (or the reader's client is `gone`); a reader that fell more than the kept bytes
        behind gets an error event, not a stream cut mid-event."""
        while not gone():
            if offset < self.dropped:
                yield sse({"error": LOST})
                return
            if offset < self.total:
                chunk = bytes(self.buffer[offset - self.dropped :])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WAKE_SECONDS)


class Server(Protocol):
    """What the stream endpoints use of the server (`state.Server`)."""

    streams: Sessions
    worker: Any  # sleep_lock, in_flight, last_activity: the idle clock of --sleep-idle-seconds
    settings: Any


class Sessions:
    """The live sessions by conversation id; finished ones expire after `TTL_SECONDS`."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def get(self, conversation_id: str) -> Session | None:
        self._expire()
        return self.sessions.get(conversation_id)

    def create(self, conversation_id: str) -> Session:
        """A new session for the conversation; one before it is cancelled."""
        self.stop(conversation_id)
        self._expire()
        session = self.sessions[conversation_id] = Session(conversation_id)
        return session

    def stop(self, conversation_id: str) -> None:
        session = self.sessions.pop(conversation_id, None)
        if session is not None:
            session.cancel()

    def forget(self, session: Session) -> None:
        """Drop a session that will hold nothing (its request failed or answered whole)."""
        if self.sessions.get(session.conversation_id) is session:
            del self.sessions[session.conversation_id]
        session.finish()

    def lookup(self, ids: list[str]) -> list[Session]:
        """The sessions of the ids asked for: each id itself and its `ID::model` variants."""
        self._expire()
        found = []
        for wanted in ids:
            for session in self.sessions.values():
                name = session.conversation_id
                if name == wanted or name.startswith(wanted + "::"):
                    found.append(session)
        return found

    def close(self) -> None:
        """At shutdown: every reply stopped, every reader ended."""
        for name in list(self.sessions):
            self.stop(name)

    def _expire(self) -> None:
        cutoff = time.time() - TTL_SECONDS
        for name, session in list(self.sessions.items()):
            if session.completed and session.completed <= cutoff:
                del self.sessions[name]


S = TypeVar("S", bound=Server)


async def on_stop(session: Session, stop: Callable[[], None]) -> None:
    """Call `stop` once the session's Stop comes (or a newer request replaces it)."""
    await session.stopped.wait()
    stop()


def detaching(
    handler: Callable[[S, Request], Awaitable[Response]],
) -> Callable[[S, Request], Awaitable[Response]]:
    """A generation endpoint whose streamed reply, under a conversation id, is kept in a
    session and outlives its client; the client reads the session as it fills."""

    async def endpoint(server: S, request: Request) -> Response:
        name = conv_id(request)
        if not name:
            return await handler(server, request)
        # As llama-server: the session is there from the start (a new request under the id
        # replaces the one before at once; a Stop while the prompt is processed stops it).
        session = server.streams.create(name)
        request.state.stream_session = session
        try:
            response = await handler(server, request)
        except BaseException:
            server.streams.forget(session)
            raise
        if not isinstance(response, EventStream):
            server.streams.forget(session)  # an error or a whole answer: nothing to resume
            return response
        if session.cancelled:  # stopped before its first event
            await response.on_close()
            return Response(status_code=204)
        session.producer = asyncio.create_task(_produce(server, session, response))
        session.producer.add_done_callback(
            lambda task: _closed_if_cancelled(task, session, response)
        )
        return reader(request, session, 0)

    return endpoint


def _closed_if_cancelled(task: asyncio.Task[None], session: Session, response: EventStream) -> None:
    """A producer cancelled before it ran never closed its reply: close it now (cancelling
    the reply's jobs)."""
    if task.cancelled() and not session.reply_closed:
        session.reply_closed = True
        asyncio.ensure_future(response.on_close())


async def _produce(server: Server, session: Session, response: EventStream) -> None:
    """The reply's events into its session, whoever reads them (the server does not sleep
    meanwhile); a cancel (the Stop) cancels the reply."""
    worker = server.worker
    with worker.sleep_lock:
        worker.in_flight += 1
    try:
        async for chunk in response.chunks:
            session.append(chunk)
    finally:
        session.finish()
        session.reply_closed = True
        with contextlib.suppress(Exception):
            await response.on_close()
        with worker.sleep_lock:
            worker.in_flight -= 1
            worker.last_activity = time.monotonic()


def reader(request: Request, session: Session, offset: int) -> EventStream:
    """An SSE response of the session from `offset`; it ends when its client goes."""
    gone = [False]

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone[0] = True

    watcher = asyncio.create_task(watch())

    async def close() -> None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    return EventStream(session.read(offset, lambda: gone[0]), close)


def conv_param(request: Request) -> str:
    """The `conv_id` of a stream route's query (llama-server's 400 when there is none)."""
    name = request.query_params.get("conv_id", "")
    if not name:
        raise ApiError("Missing conversation id in path")
    return name


async def stream_get(server: Server, request: Request) -> Response:
    """GET /v1/stream?conv_id=ID&from=N: the session's events from byte N (0 by default)."""
    name = conv_param(request)
    session = server.streams.get(name)
    if session is None:
        raise ApiError("Stream not found or expired", "not_found_error")
    start = request.query_params.get("from", "")
    if start and not (start.isascii() and start.isdigit()):
        raise ApiError("Invalid 'from' offset")
    offset = int(start or 0)
    if offset < session.dropped:
        raise ApiError("Stream offset lost, please restart")
    return reader(request, session, offset)


async def stream_delete(server: Server, request: Request) -> Response:
    """DELETE /v1/stream?conv_id=ID: stop the reply and forget its session (204 either way)."""
    server.streams.stop(conv_param(request))
    return Response(status_code=204, media_type="application/json")


async def lookup_ids(request: Request, settings: Any) -> list[str]:
    """The ids of a `POST /v1/streams/lookup` body (`{"conversation_ids": [...]}`)."""
    body = await read_json(request, settings)
    ids = body.get("conversation_ids")
    return [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []


async def streams_lookup(server: Server, request: Request) -> Response:
    """POST /v1/streams/lookup: the state of the sessions of the ids asked for."""
    ids = await lookup_ids(request, server.settings)
    return json_response(
        [
            {
                "conversation_id": s.conversation_id,
                "is_done": s.done,
                "total_bytes": s.total,
                "started_at": s.started,
                "completed_at": s.completed,
            }
            for s in server.streams.lookup(ids)
        ]
    )
