"""The engine thread dying is never silent: /health says so, and no request waits forever.

The fault is a real one inside the engine thread's loop: a job whose callback raises (as a
handler's bug would), running beside a streaming request while a plain one waits for a slot.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.engine.types import GenerationOptions, SamplingParams
from localfab.server import ServerSettings, create_app
from localfab.server.jobs import Job, Step
from localfab.server.runner import BackgroundServer

pytestmark = pytest.mark.model

LONG = {"n_predict": 1500, "ignore_eos": True, "temperature": 0}


class Fault(Exception):
    """What the job's callback raises once armed."""


@pytest.fixture()
def served(model_path: Path) -> Iterator[tuple[str, Any, Any]]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=4096, n_batch=512, n_seq_max=2))
    app = create_app(loaded, ServerSettings(n_parallel=2))
    server = BackgroundServer(app).start()
    try:
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.05)
        yield server.url, app.state.worker, loaded
    finally:
        server.stop()
        loaded.close()


def _engine_stopped(body: dict[str, Any]) -> str:
    error = body["error"]
    assert error["code"] == 503 and error["type"] == "unavailable_error", body
    assert "engine stopped" in error["message"] and "Fault: injected" in error["message"], body
    return str(error["message"])


def test_a_fault_in_the_engine_thread_fails_every_request_and_health_says_why(
    served: tuple[str, Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    url, worker, loaded = served
    caplog.set_level(logging.ERROR, logger="localfab.server")
    armed, running = threading.Event(), threading.Event()

    def emit(item: object) -> None:
        if isinstance(item, Step):
            running.set()
            if armed.is_set():
                raise Fault("injected")

    bomb = Job(
        id=worker.next_id(),
        tokens=loaded.engine.tokenize("Count slowly:", add_special=True),
        options=GenerationOptions(max_tokens=1500, sampling=SamplingParams(ignore_eos=True)),
        emit=emit,
    )
    worker.submit(bomb)
    assert running.wait(60), "the job never ran"

    queued: list[httpx.Response] = []

    def plain() -> None:  # waits for a slot: both are busy
        body = {"prompt": "A plain request that waits", **LONG}
        queued.append(httpx.post(url + "/completion", json=body, timeout=60))

    events: list[dict[str, Any]] = []
    t0 = time.monotonic()
    body = {"prompt": "Once upon a time", "stream": True, **LONG}
    with httpx.stream("POST", url + "/completion", json=body, timeout=60) as stream:
        waiter = threading.Thread(target=plain, daemon=True)
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[len("data: ") :]))
            if len(events) == 1:  # the stream runs: a plain request queues, then the fault
                waiter.start()
                deadline = time.monotonic() + 30
                while worker.queued < 1:
                    assert time.monotonic() < deadline, "the plain request never queued"
                    time.sleep(0.01)
                armed.set()
    waiter.join(30)
    assert time.monotonic() - t0 < 60
    # The stream ends with the error (not as a reply cut short), the queued request gets it.
    assert "error" in events[-1], events[-1]
    message = _engine_stopped(events[-1])
    assert queued and queued[0].status_code == 503, queued
    assert _engine_stopped(queued[0].json()) == message
    # /health says it, in llama-server's error shape.
    for path in ("/health", "/v1/health"):
        r = httpx.get(url + path, timeout=5)
        assert r.status_code == 503 and _engine_stopped(r.json()) == message
    # A later request of any kind gets it at once, instead of waiting forever.
    t1 = time.monotonic()
    later = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 4}, timeout=10)
    assert later.status_code == 503 and _engine_stopped(later.json()) == message
    pieces = httpx.post(url + "/tokenize", json={"content": "Hi", "with_pieces": True}, timeout=10)
    assert pieces.status_code == 503 and _engine_stopped(pieces.json()) == message
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "stream": True},
        timeout=10,
    )
    assert chat.status_code == 503 and _engine_stopped(chat.json()) == message
    assert time.monotonic() - t1 < 5
    # The traceback is logged once.
    logged = [r for r in caplog.records if "engine thread stopped" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert isinstance(logged[0].exc_info[1], Fault)
