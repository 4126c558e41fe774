"""Running the app under uvicorn: in the foreground for `localfab serve`, in a thread for tests.

Connections go through `EdgeProtocol`, uvicorn's h11 protocol with two guards it lacks: a
deadline for the request head (a client that sends half a head and waits would otherwise hold
its connection forever: slowloris) and a cap on open connections, past which a new connection
gets 503 at once instead of using up file descriptors.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

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


def _busy_response(max_connections: int) -> bytes:
    body = ApiError(
        f"the server has {max_connections} connections open, the most it takes "
        "(--max-connections); try again shortly",
        "unavailable_error",
    ).body()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class EdgeProtocol(H11Protocol):
    """h11 with a request-head deadline and a connection cap (class attributes, see `edge`)."""

    header_timeout: float = _DEFAULTS.header_timeout
    max_connections: int = _DEFAULTS.max_connections

    _head_timer: asyncio.TimerHandle | None = None
    _refused: bool = False
    _lingering: ClassVar[list[int]] = [0]  # refused connections still draining

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm_head_timer()

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 before reading anything, then drain what the client sends until it
        closes (or a moment passes), so it reads the 503 instead of a reset."""
        self._refused = True
        self.transport = transport
        transport.write(_busy_response(self.max_connections))
        log.warning("refused a connection: %d open", len(self.connections))
        if self._lingering[0] >= _REFUSED_LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return
        self._lingering[0] += 1
        transport.write_eof()
        self._head_timer = self.loop.call_later(_REFUSED_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        # Waiting for a head (the first, or the next on a kept-alive connection): time it.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_head_timer()
        else:
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            if self._head_timer is not None:
                self._lingering[0] -= 1
            self._cancel_head_timer()
            return
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info(
                "closed a connection with no complete request head in %gs", self.header_timeout
            )
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
        h11_max_incomplete_event_size=64 * 1024,
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


class CancellingServer(uvicorn.Server):
    """On SIGINT/SIGTERM, first cancel running generations so shutdown does not wait for them."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Not recorded in uvicorn's _captured_signals: it would re-raise the signal after
        # shutdown and the process would die of it instead of exiting 0 like llama-server.
        # A second Ctrl-C forces the exit.
        self._on_exit()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


class BackgroundServer:
    """Serve `app` on 127.0.0.1 at a free port in a daemon thread (tests, benchmarks)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        header_timeout: float = _DEFAULTS.header_timeout,
        max_connections: int = _DEFAULTS.max_connections,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
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
