"""Running the app under uvicorn: in the foreground for `localfab serve`, in a thread for tests."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn


def _config(app: Any, *, host: str, port: int, verbose: bool = False) -> uvicorn.Config:
    """No "server: uvicorn" header, bounded header size and shutdown; access log only if verbose."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=64 * 1024,
    )


def make_server(app: Any, *, host: str, port: int) -> uvicorn.Server:
    """A uvicorn server for the app (tests run it in a thread)."""
    return uvicorn.Server(_config(app, host=host, port=port))


def make_foreground_server(
    app: Any, *, host: str, port: int, verbose: bool, on_exit: Callable[[], None]
) -> CancellingServer:
    """The server `localfab serve` runs: SIGINT/SIGTERM cancel generations, then shut down."""
    return CancellingServer(_config(app, host=host, port=port, verbose=verbose), on_exit=on_exit)


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

    def __init__(self, app: Any, *, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = make_server(app, host=host, port=self.port)
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
