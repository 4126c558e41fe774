"""Resumable streams, as llama-server keeps them (tools/server/server-stream.cpp).

A streamed generation request that carries `X-Conversation-Id` is detached from its client:
its events go into a session kept under that id, the reply goes on when the client drops (a
page reload, a lost network), and the client reads them back from any byte offset with
`GET /v1/stream?conv_id=ID&from=N` (the replay, then the live events until the reply ends).
`DELETE /v1/stream?conv_id=ID` is the user's Stop: the reply is cancelled and its session
forgotten. `POST /v1/streams/lookup` tells a client about the ids it names, never others, and
takes at most `MAX_LOOKUP_IDS` of them (llama-server takes any number, but scans every session
for each id: a few hundred thousand ids held its event loop for seconds).

A session belongs to the API key that started it: with several keys (`--api-key` given more
than once, or a key file), each key's holder reads, stops and looks up only its own, and the
same conversation id under two keys is two sessions. Another key's session is a 404, as if it
were not there (llama-server lets any key reach any session).

One conversation has at most one session: a new request under the same id cancels the one
before. A session keeps its last 4 MiB of events and is forgotten 5 minutes after its reply
ended. The conversation id travels in the query string because it may hold a model name with
slashes.
"""

from __future__ import annotations

import asyncio
import bisect
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
MAX_LOOKUP_IDS = 10_000  # the conversation ids one lookup may name
SEPARATOR = "::"  # between a conversation id and the model of its `ID::model` variant


def conv_id(request: Request) -> str:
    """The request's conversation id ('' when it has none)."""
    return request.headers.get(HEADER, "")


class Keyed(Protocol):
    """What tells a request's owner: the server's or the router's key check."""

    key_ok: Any  # KeyCheck: owner(headers), the key a request carries


def owner_of(server: Keyed, request: Request) -> str:
    """Whose sessions the request reaches: its API key's ('' for all when there are fewer
    than two keys); never holds a '/'."""
    which = server.key_ok.owner(request.headers)
    return "" if which is None else f"key{which}"


class Session:
    """The events of one reply: appended by its producer, read from any offset by readers."""

    def __init__(self, conversation_id: str, cap: int = MAX_BYTES, owner: str = "") -> None:
        self.conversation_id = conversation_id
        self.owner = owner  # the API key that started it (see `owner_of`)
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
    key_ok: Any  # KeyCheck: owner(headers), the key a request carries (see `owner_of`)
    worker: Any  # sleep_lock, in_flight, last_activity: the idle clock of --sleep-idle-seconds
    settings: Any


class Sessions:
    """The live sessions by owner and conversation id; finished ones expire after
    `TTL_SECONDS`."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], Session] = {}

    def get(self, conversation_id: str, owner: str = "") -> Session | None:
        self._expire()
        return self.sessions.get((owner, conversation_id))

    def create(self, conversation_id: str, owner: str = "") -> Session:
        """A new session for the conversation; one before it is cancelled."""
        self.stop(conversation_id, owner)
        self._expire()
        session = Session(conversation_id, owner=owner)
        self.sessions[owner, conversation_id] = session
        return session

    def stop(self, conversation_id: str, owner: str = "") -> None:
        session = self.sessions.pop((owner, conversation_id), None)
        if session is not None:
            session.cancel()

    def forget(self, session: Session) -> None:
        """Drop a session that will hold nothing (its request failed or answered whole)."""
        key = (session.owner, session.conversation_id)
        if self.sessions.get(key) is session:
            del self.sessions[key]
        session.finish()

    def lookup(self, ids: list[str], owner: str = "") -> list[Session]:
        """The owner's sessions of the ids asked for: each id itself and its `ID::model`
        variants, each session once.

        The names are sorted, so that each id's variants are one range found by bisection
        (those starting with `ID::` lie in [`ID::`, `ID:;`)), and a session already found is
        skipped, never visited again: a lookup costs its ids times a bisection, whatever the
        sessions' names hold, not its ids times the sessions."""
        self._expire()
        mine = sorted(
            (s for (whose, _), s in self.sessions.items() if whose == owner),
            key=lambda s: s.conversation_id,
        )
        names = [s.conversation_id for s in mine]
        # nxt[i] == i: session i not yet found; else a step toward the next one that is not.
        nxt = list(range(len(names) + 1))

        def unfound(i: int) -> int:
            while nxt[i] != i:
                nxt[i] = nxt[nxt[i]]
                i = nxt[i]
            return i

        found: list[Session] = []
        for wanted in ids:
            at = bisect.bisect_left(names, wanted)
            if at < len(names) and names[at] == wanted and nxt[at] == at:
                found.append(mine[at])
                nxt[at] = at + 1
            at = unfound(bisect.bisect_left(names, wanted + SEPARATOR))
            end = bisect.bisect_left(names, wanted + ":;")
            while at < end:
                found.append(mine[at])
                nxt[at] = at + 1
                at = unfound(at + 1)
        return found

    def close(self) -> None:
        """At shutdown: every reply stopped, every reader ended."""
        for owner, name in list(self.sessions):
            self.stop(name, owner)

    def _expire(self) -> None:
        cutoff = time.time() - TTL_SECONDS
        for key, session in list(self.sessions.items()):
            if session.completed and session.completed <= cutoff:
                del self.sessions[key]


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
        session = server.streams.create(name, owner_of(server, request))
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
    session = server.streams.get(name, owner_of(server, request))
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
    """DELETE /v1/stream?conv_id=ID: stop the reply and forget its session (204 either way,
    also for another key's session, which is left alone)."""
    server.streams.stop(conv_param(request), owner_of(server, request))
    return Response(status_code=204, media_type="application/json")


async def lookup_ids(request: Request, settings: Any) -> list[str]:
    """The ids of a `POST /v1/streams/lookup` body (`{"conversation_ids": [...]}`); a 400
    for more than `MAX_LOOKUP_IDS` of them."""
    body = await read_json(request, settings)
    ids = body.get("conversation_ids")
    if not isinstance(ids, list):
        return []
    if len(ids) > MAX_LOOKUP_IDS:
        raise ApiError(
            f"a lookup names at most {MAX_LOOKUP_IDS} conversation ids, this one names "
            f"{len(ids)}: look them up in batches of {MAX_LOOKUP_IDS} or fewer"
        )
    return [i for i in ids if isinstance(i, str) and i]


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
            for s in server.streams.lookup(ids, owner_of(server, request))
        ]
    )
