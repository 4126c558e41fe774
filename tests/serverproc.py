"""`localfab serve` in a child process, watched from outside: alive, /health latency, RSS.

Hostile-request tests need a server whose crash (SIGSEGV, abort) or freeze they can see, so the
server runs as the installed console script, not in the test's own process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.conftest import LOCALFAB


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the test process dies, so no server outlives its test."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HealthWatch:
    """Polls /health every `interval` seconds in a thread; records every answer's latency.

    `worst` is the slowest answer seen (a request that failed or took longer than `limit`
    counts as `limit` + its time), `failures` the polls that got no 200.
    """

    def __init__(self, url: str, *, interval: float = 0.1, limit: float = 1.0) -> None:
        self.url = url
        self.interval = interval
        self.limit = limit
        self.worst = 0.0
        self.failures: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=self.limit) as http:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    status = http.get(self.url + "/health").status_code
                    if status != 200:
                        self.failures.append(f"/health answered {status}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"/health: {type(exc).__name__}")
                self.worst = max(self.worst, time.monotonic() - t0)
                self.polls += 1
                self._stop.wait(self.interval)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.limit + 5)


class ServerProcess:
    """A running `localfab serve` child; `stop()` ends it and returns its stderr."""

    def __init__(
        self,
        model: Path,
        *args: str,
        env: dict[str, str] | None = None,
        program: Path | None = None,
    ) -> None:
        """`program`: another server taking llama-server's -m and --port (llama-server)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.program = program
        command = [str(program)] if program is not None else [str(LOCALFAB), "serve"]
        self.proc = subprocess.Popen(
            [*command, "-m", str(model), "--port", str(self.port), *args],
            env=env if env is not None else dict(os.environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.stop()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("server never became healthy")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        """Resident memory of the server process, in bytes."""
        return int(self.ps.memory_info().rss)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        stream = self.proc.stderr
        if stream is None or stream.closed:
            return ""
        with stream:  # closed here: an open pipe is a ResourceWarning (an error under pytest)
            return stream.read()


@contextmanager
def serve(model: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    server = ServerProcess(model, *args, env=env)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def serve_in_process(loaded: Any, settings: Any) -> Iterator[str]:
    """A server on `loaded` (a LoadedModel) with `settings` in this process, its URL once
    /health answers; stopped, and the model closed, when the generator is closed."""
    import time

    import httpx

    from localfab.server import create_app
    from localfab.server.runner import BackgroundServer

    server = BackgroundServer(create_app(loaded, settings)).start()
    try:
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.05)
        yield server.url
    finally:
        server.stop()
        loaded.close()
