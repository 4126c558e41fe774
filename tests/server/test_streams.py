"""Resumable streams (X-Conversation-Id, /v1/stream) on the real model: the reply goes on when
its client drops and is read back from any offset; the Stop cancels it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from localfab.server import ServerSettings
from tests.serverproc import HealthWatch, serve_in_process

pytestmark = pytest.mark.model

CONV = "conv-1::org/model:Q4"  # a model name with a slash, as llama-server's web UI makes them


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_seq_max=2, kv_unified=True))
    yield from serve_in_process(loaded, ServerSettings(n_parallel=2))


def chat(url: str, conv: str, max_tokens: int = 24, **extra: object) -> str:
    """A streamed chat under `conv`, read whole; the SSE text."""
    body = {
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": max_tokens,
        "stream": True,
        **extra,
    }
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}
    ) as answer:
        assert answer.status_code == 200
        return "".join(answer.iter_text())


def replay(url: str, conv: str, start: int = 0) -> httpx.Response:
    return httpx.get(url + "/v1/stream", params={"conv_id": conv, "from": start}, timeout=60)


def content(sse: str) -> str:
    text = ""
    for line in sse.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def test_a_finished_stream_replays_from_any_offset_and_the_stop_forgets_it(url: str) -> None:
    sse = chat(url, CONV)
    assert sse.endswith("data: [DONE]\n\n") and content(sse)
    whole = replay(url, CONV)
    assert whole.status_code == 200 and whole.text == sse
    assert whole.headers["content-type"].startswith("text/event-stream")
    assert replay(url, CONV, 10).text == sse.encode()[10:].decode()
    found = httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": ["conv-1", "x"]})
    [entry] = found.json()
    assert entry["conversation_id"] == CONV and entry["is_done"] is True
    assert entry["total_bytes"] == len(sse.encode()) and entry["completed_at"] > 0
    assert httpx.delete(url + "/v1/stream", params={"conv_id": CONV}).status_code == 204
    gone = replay(url, CONV)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    # A Stop of what is not there is a 204 too; bad parameters are 400s.
    assert httpx.delete(url + "/v1/stream", params={"conv_id": CONV}).status_code == 204
    assert httpx.get(url + "/v1/stream").status_code == 400
    chat(url, CONV, max_tokens=2)
    assert replay(url, CONV, -1).json()["error"]["message"] == "Invalid 'from' offset"


def test_the_reply_goes_on_when_its_client_drops_and_is_read_back_whole(url: str) -> None:
    conv = "conv-dropped"
    parts = urlsplit(url)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 48,
            "stream": True,
            "ignore_eos": True,
        }
    )
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nX-Conversation-Id: {conv}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    )
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(request.encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")  # the stream began; then the drop
    whole = replay(url, conv)  # waits for the rest of the reply
    assert whole.status_code == 200 and whole.text.endswith("data: [DONE]\n\n")
    last = [line for line in whole.text.splitlines() if line.startswith("data: {")][-1]
    assert json.loads(last[6:])["timings"]["predicted_n"] == 48  # none lost to the drop


def test_the_stop_cancels_a_running_reply_and_a_new_request_replaces_it(url: str) -> None:
    conv = "conv-stopped"
    body = {
        "messages": [{"role": "user", "content": "Count from one to a thousand."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.monotonic()
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}
    ) as answer:
        lines = answer.iter_lines()
        assert next(lines).startswith("data: ")
        assert httpx.delete(url + "/v1/stream", params={"conv_id": conv}).status_code == 204
        rest = list(lines)  # the stream ends at the Stop, not after 1500 tokens
    assert not any("[DONE]" in line for line in rest)
    assert time.monotonic() - t0 < 30
    slots = httpx.get(url + "/slots").json()
    assert not any(slot["is_processing"] for slot in slots)  # the reply itself was cancelled
    # A second request under the same id cancels the first one's reply.
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}
    ) as first:
        lines = first.iter_lines()
        next(lines)
        sse = chat(url, conv, max_tokens=3)
        assert content(sse) and not any("[DONE]" in line for line in lines)
    assert replay(url, conv).text == sse


def test_a_request_without_the_header_still_ends_with_its_client(url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as answer:
        next(answer.iter_lines())
    deadline = time.monotonic() + 20
    while any(slot["is_processing"] for slot in httpx.get(url + "/slots").json()):
        assert time.monotonic() < deadline, "the reply went on without its client"
        time.sleep(0.1)


def test_a_stop_while_the_prompt_is_processed_stops_the_reply(url: str) -> None:
    """The session is there from the request's start: a Stop before the first token ends it."""
    import threading

    conv = "conv-early"
    long = "Tell me a story. " * 300  # some seconds of prompt processing here
    body = {"prompt": long, "n_predict": 200, "ignore_eos": True, "stream": True}
    done: list[str] = []

    def post() -> None:
        with httpx.stream(
            "POST", url + "/completion", json=body, headers={"X-Conversation-Id": conv}, timeout=120
        ) as answer:
            done.append("".join(answer.iter_text()))

    thread = threading.Thread(target=post)
    thread.start()
    deadline = time.monotonic() + 10
    while not httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": [conv]}).json():
        assert time.monotonic() < deadline, "the session did not appear at the request's start"
        time.sleep(0.02)
    assert httpx.delete(url + "/v1/stream", params={"conv_id": conv}).status_code == 204
    thread.join(60)
    assert done and '"stop":true' not in done[0]  # it never reached its end
    deadline = time.monotonic() + 20  # the job ends at its next step (a prompt batch)
    while any(slot["is_processing"] for slot in httpx.get(url + "/slots").json()):
        assert time.monotonic() < deadline, "the reply went on after the Stop"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def many(model_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A server holding 300 finished sessions (`ID::model` names, as llama-server's web UI
    makes them), and their names.

    The sessions are put in the server's own `Sessions` before any request: 300 generations
    would take minutes on a small machine, and what is looked up is the same either way.
    """
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model
    from localfab.server import create_app
    from localfab.server.runner import BackgroundServer

    loaded = load_model(model_path, EngineSettings(n_ctx=512))
    app = create_app(loaded, ServerSettings())
    names = [f"many-{i}::org/model-{i % 3}" for i in range(300)]
    for name in names:
        session = app.state.server.streams.create(name)
        session.append(b'data: {"content": "hi"}\n\n')
        session.finish()
    server = BackgroundServer(app).start()
    try:
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.05)
        yield server.url, names
    finally:
        server.stop()
        loaded.close()


def test_a_lookup_of_many_ids_is_bounded_and_health_answers_meanwhile(
    many: tuple[str, list[str]],
) -> None:
    from localfab.server.streams import MAX_LOOKUP_IDS

    url, names = many

    def lookup(ids: list[str]) -> httpx.Response:
        return httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": ids}, timeout=300)

    ids = [f"many-{i}" for i in range(MAX_LOOKUP_IDS)]  # the most a lookup may name; 300 hit
    with HealthWatch(url, limit=5.0) as watch:
        # 200,000 ids each scanned against the 300 sessions held the event loop for 17 s.
        huge = lookup([f"nothing-{i}" for i in range(200_000)])
        found = lookup(ids)
        twice = lookup(["many-1", "many-1", "many-1::org/model-1"])
    assert huge.status_code == 400, huge.text[:300]
    message = huge.json()["error"]["message"]
    assert f"at most {MAX_LOOKUP_IDS} conversation ids" in message and "200000" in message
    assert found.status_code == 200
    assert sorted(e["conversation_id"] for e in found.json()) == sorted(names)
    assert all(e["is_done"] and e["total_bytes"] > 0 for e in found.json())
    assert [e["conversation_id"] for e in twice.json()] == ["many-1::org/model-1"]  # once
    assert [e["conversation_id"] for e in lookup(["many-12::org/model-0"]).json()] == [
        "many-12::org/model-0"
    ]
    assert lookup(["many-1::org", "many-", "org/model-1"]).json() == []  # whole names only
    assert watch.polls > 0
    assert not watch.failures, watch.failures[:5]
