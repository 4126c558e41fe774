"""--sleep-idle-seconds: the model leaves memory after a quiet spell and comes back with the next
request; the read-only endpoints (and /metrics) answer meanwhile without waking it, as in
llama.cpp's own test_sleep.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serverproc import ServerProcess, serve

pytestmark = pytest.mark.model


@pytest.fixture()
def server(model_path: Path) -> Iterator[ServerProcess]:
    with serve(model_path, "--sleep-idle-seconds", "1", "--metrics") as running:
        yield running


def _sleeping(server: ServerProcess) -> bool:
    props = httpx.get(server.url + "/props", timeout=10)
    assert props.status_code == 200
    return bool(props.json()["is_sleeping"])


def _wait_for_sleep(server: ServerProcess) -> None:
    deadline = time.monotonic() + 15
    while not _sleeping(server):
        assert time.monotonic() < deadline, "the server never went to sleep"
        time.sleep(0.1)


def test_sleep_frees_the_model_and_a_request_wakes_it(server: ServerProcess) -> None:
    done = httpx.post(
        server.url + "/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0}
    )
    assert done.status_code == 200
    awake_rss = server.rss()
    _wait_for_sleep(server)
    # The weights and the KV cache are gone (the model is freed just after it says it sleeps).
    deadline = time.monotonic() + 10
    while server.rss() >= awake_rss - 100 * 2**20:
        assert time.monotonic() < deadline, (server.rss(), awake_rss)
        time.sleep(0.1)
    for path in ("/health", "/props", "/v1/models", "/slots", "/metrics"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path
    assert _sleeping(server)  # none of those woke it
    woke = httpx.post(
        server.url + "/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0}
    )
    assert woke.status_code == 200 and woke.json()["content"] == done.json()["content"]
    assert not _sleeping(server)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/responses/input_tokens", {"input": "Hello world"}),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/tokenize", {"content": "Hello"}),
    ],
)
def test_counting_tokens_wakes_it(server: ServerProcess, path: str, body: dict) -> None:  # type: ignore[type-arg]
    _wait_for_sleep(server)
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    if path != "/tokenize":
        assert answer.json()["input_tokens"] > 0
    assert not _sleeping(server)
