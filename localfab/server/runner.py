"""Running the app under uvicorn: in the foreground for `localfab serve`, in a thread for tests.

Connections go through `EdgeProtocol`, uvicorn's h11 protocol with two guards it lacks: a
deadline for the request head (a client that sends half a head and waits would otherwise hold
its connection forever: slowloris) and a cap on open connections, so that they cannot use up
file descriptors. At the cap, a new connection takes the place of an idle one (no complete
request head yet, or answered and only the rest of its body still coming), so that sockets
trickling heads cannot keep out requests that arrive whole; only when every connection has a
request in progress does a new one get 503 at once. A request head that outgrows `HEAD_LIMIT`
is answered 431 and its connection drained before it is closed (uvicorn answers 400 and closes
at once, and the bytes still coming make the close a reset the client sees instead).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from localfab.errors import UsageError
from localfab.server.errors import ApiError
from localfab.server.settings import ServerSettings

log = logging.getLogger("localfab.server")

_DEFAULTS = ServerSettings()
# Descriptors kept for everything but connections: the listening socket, the model file, logs.
FD_RESERVE = 64
# How long a refused connection may drain before it is closed, and how many may drain at once
# (within FD_RESERVE); past that a refused connection is closed at once.
_REFUSED_LINGER = 1.0
_REFUSED_LINGERING_MAX = 16
HEAD_LIMIT = 64 * 1024  # bytes of an incomplete request head (h11's receive buffer)


def _busy_response(max_connections: int) -> bytes:
    body = ApiError(
        f"the server has {max_connections} connections with requests in progress, the most "
        "it takes (--max-connections); try again shortly",
        "unavailable_error",
    ).body()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _head_too_large_response() -> bytes:
    body = ApiError(
        f"the request head (request line and header fields) is larger than the {HEAD_LIMIT} "
        "bytes allowed: send fewer or shorter header fields (data belongs in the body)",
        code=431,
    ).body()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        "content-type: application/json; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_HEAD_TOO_LARGE = _head_too_large_response()


class EdgeProtocol(H11Protocol):
    """h11 with a deadline for idle connections and a connection cap (class attributes, see
    `edge`).

    A connection is idle while the server owes it nothing: before its request head is complete
    (the first, or the next on a kept-alive connection), and after its answer while the rest of
    the request body still comes. Idle connections are closed at the deadline and are the ones
    given up at the cap: the oldest of the client address holding the most, so that one client
    trickling heads loses its own sockets before anyone else's, and a head that arrives whole
    right after its connection outlives the cap being filled again behind it.
    """

    header_timeout: float = _DEFAULTS.header_timeout
    max_connections: int = _DEFAULTS.max_connections

    _head_timer: asyncio.TimerHandle | None = None
    _refused: bool = False  # nothing more is read: refused at the cap, or draining (below)
    _draining: bool = False  # answered 431, the rest of its head read and dropped
    _lingering: ClassVar[list[int]] = [0]  # refused connections still draining
    # Idle connections by client address, each in the order they became idle (oldest first).
    _idle: ClassVar[dict[str, dict[EdgeProtocol, None]]] = {}
    _idle_key: str | None = None  # the address this connection is filed under in `_idle`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections and not self._close_an_idle_one():
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm_head_timer()
        self._file_idle()

    def _close_an_idle_one(self) -> bool:
        """Close the oldest idle connection of the address holding the most; False if none is
        idle (every connection has a request in progress)."""
        if not self._idle:
            return False
        key = max(self._idle, key=lambda k: len(self._idle[k]))
        victim = next(iter(self._idle[key]))
        victim.unfile_idle()
        log.info("closed an idle connection from %s to make room for a new one", key)
        victim.transport.close()
        return True

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 before reading anything, then drain what the client sends until it
        closes (or a moment passes), so it reads the 503 instead of a reset."""
        self._refused = True
        self.transport = transport
        transport.write(_busy_response(self.max_connections))
        log.warning("refused a connection: %d open, none idle", len(self.connections))
        if self._lingering[0] >= _REFUSED_LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return
        self._lingering[0] += 1
        transport.write_eof()
        self._head_timer = self.loop.call_later(_REFUSED_LINGER, transport.close)

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its `except h11.RemoteProtocolError`: the error at hand
        # says why; h11 hints 431 when the head outgrew its buffer.
        if getattr(sys.exc_info()[1], "error_status_hint", 400) != 431:
            super().send_400_response(msg)
            return
        log.warning("answered 431: a request head larger than %d bytes", HEAD_LIMIT)
        self._cancel_head_timer()
        self.unfile_idle()
        self._refused = self._draining = True
        self.transport.write(_HEAD_TOO_LARGE)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # Closing now, with the head's rest still arriving, would reset the connection and the
        # client would lose the answer: the answer ends the sending side, and what still comes
        # is read and dropped until the client closes (or a moment passes).
        self.transport.write_eof()
        self._head_timer = self.loop.call_later(_REFUSED_LINGER, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        # Idle (waiting for a head, or draining an answered request's body): keep the deadline
        # already running, so trickled bytes never postpone it.
        if self._is_idle():
            self._arm_head_timer()
        else:
            self._cancel_head_timer()
        self._file_idle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Answered before the request body was all read (an error, or an endpoint that takes no
        # body): the rest may come, but only until the deadline. uvicorn's keep-alive timer
        # would not bound it: every byte received restarts that one.
        if self._is_idle() and self.conn.their_state is not h11.IDLE:
            self._arm_head_timer()
        self._file_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused and not self._draining:
            if self._head_timer is not None:
                self._lingering[0] -= 1
            self._cancel_head_timer()
            return
        self._cancel_head_timer()
        self.unfile_idle()
        super().connection_lost(exc)

    def _is_idle(self) -> bool:
        """Whether the server owes this connection nothing: no request head yet, or the answer
        sent and only the rest of the request body still coming."""
        if self.transport.is_closing():
            return False
        theirs, ours = self.conn.their_state, self.conn.our_state
        return theirs is h11.IDLE or (ours is h11.DONE and theirs is h11.SEND_BODY)

    def _file_idle(self) -> None:
        """Keep this connection's place in `_idle` in step with `_is_idle()`."""
        if not self._is_idle():
            self.unfile_idle()
        elif self._idle_key is None:
            self._idle_key = self.client[0] if self.client else ""
            self._idle.setdefault(self._idle_key, {})[self] = None

    def unfile_idle(self) -> None:
        if self._idle_key is None:
            return
        same = self._idle.get(self._idle_key, {})
        same.pop(self, None)
        if not same:
            self._idle.pop(self._idle_key, None)
        self._idle_key = None

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._is_idle():
            log.info(
                "closed a connection with no complete request head (or an answered request's "
                "body still coming) after %gs",
                self.header_timeout,
            )
            self.unfile_idle()
            self.transport.close()


def edge(*, header_timeout: float, max_connections: int) -> type[EdgeProtocol]:
    """An `EdgeProtocol` class with these limits (uvicorn builds one protocol per connection)."""
    if header_timeout <= 0 or max_connections < 1:
        raise ValueError("header_timeout and max_connections must be positive")
    return type(
        "EdgeProtocol",
        (EdgeProtocol,),
        {
            "header_timeout": header_timeout,
            "max_connections": max_connections,
            "_lingering": [0],
            "_idle": {},
        },
    )


def connection_cap(max_connections: int) -> int:
    """`max_connections`, lowered if need be to what the open-file limit leaves room for.

    Raises the soft limit toward the hard one first, as servers commonly do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


def _config(
    app: Any,
    *,
    host: str,
    port: int,
    verbose: bool = False,
    header_timeout: float = _DEFAULTS.header_timeout,
    max_connections: int = _DEFAULTS.max_connections,
) -> uvicorn.Config:
    """No "server: uvicorn" header, bounded header size, head time, connections and shutdown;
    access log only if verbose."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=edge(header_timeout=header_timeout, max_connections=max_connections),
        log_level="info" if verbose else "warning",
        access_log=verbose,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=HEAD_LIMIT,
    )


def make_server(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout: float = _DEFAULTS.header_timeout,
    max_connections: int = _DEFAULTS.max_connections,
) -> uvicorn.Server:
    """A uvicorn server for the app (tests run it in a thread)."""
    return uvicorn.Server(
        _config(
            app,
            host=host,
            port=port,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )
    )


def make_foreground_server(
    app: Any,
    *,
    host: str,
    port: int,
    verbose: bool,
    on_exit: Callable[[], None],
    header_timeout: float = _DEFAULTS.header_timeout,
    max_connections: int = _DEFAULTS.max_connections,
) -> CancellingServer:
    """The server `localfab serve` runs: SIGINT/SIGTERM cancel generations, then shut down."""
    config = _config(
        app,
        host=host,
        port=port,
        verbose=verbose,
        header_timeout=header_timeout,
        max_connections=max_connections,
    )
    return CancellingServer(config, on_exit=on_exit)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a UsageError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror})") from exc
    sock.set_inheritable(True)
    return sock


class CancellingServer(uvicorn.Server):
    """On SIGINT/SIGTERM, first cancel running generations so shutdown does not wait for them."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve; on each address of a comma-separated --host (as llama-server)."""
        hosts = [h.strip() for h in self.config.host.split(",") if h.strip()]
        if sockets is None and len(hosts) > 1:
            sockets = [_listen(h.strip("[]"), self.config.port) for h in hosts]
        super().run(sockets=sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Not recorded in uvicorn's _captured_signals: it would re-raise the signal after
        # shutdown and the process would die of it instead of exiting 0 like llama-server.
        # A second Ctrl-C forces the exit.
        self._on_exit()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


class BackgroundServer:
    """Serve `app` in a daemon thread, on 127.0.0.1 at a free port (tests, benchmarks) or
    where `host` and `port` say (the chat app's `--serve`)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        header_timeout: float = _DEFAULTS.header_timeout,
        max_connections: int = _DEFAULTS.max_connections,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise UsageError(
                f"cannot listen on {host}:{port} ({exc.strerror}): another server may use the "
                "port; pick another with --serve HOST:PORT"
            ) from exc
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = make_server(
            app,
            host=host,
            port=self.port,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )
        self.thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
