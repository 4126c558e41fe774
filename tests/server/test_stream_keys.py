"""Resumable streams under several API keys, on the real model over a real socket: a stream
belongs to the key that started it (another key's holder meets a 404, as if it were not there),
and the same conversation id under two keys is two sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serverproc import ServerProcess, serve

pytestmark = pytest.mark.model

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    keys = ("--api-key", "key-a", "--api-key", "key-b")
    with serve(model_path, "-c", "2048", "-np", "2", *keys) as srv:
        yield srv


def start(url: str, conv: str, key: dict[str, str], n: int = 4) -> str:
    """A streamed completion under `conv` with `key`, read whole; its SSE text."""
    body = {"prompt": "Count: one, two,", "n_predict": n, "stream": True}
    headers = {**key, "X-Conversation-Id": conv}
    with httpx.stream("POST", url + "/completion", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return "".join(r.iter_text())


def replay(url: str, conv: str, key: dict[str, str]) -> httpx.Response:
    return httpx.get(url + "/v1/stream", params={"conv_id": conv}, headers=key, timeout=60)


def stop(url: str, conv: str, key: dict[str, str]) -> int:
    return httpx.delete(url + "/v1/stream", params={"conv_id": conv}, headers=key).status_code


def lookup(url: str, ids: list[str], key: dict[str, str]) -> httpx.Response:
    body = {"conversation_ids": ids}
    return httpx.post(url + "/v1/streams/lookup", json=body, headers=key, timeout=120)


def test_a_stream_is_its_keys_alone(server: ServerProcess) -> None:
    url = server.url
    sse = start(url, "conv-mine", A)
    assert replay(url, "conv-mine", A).text == sse
    theirs = replay(url, "conv-mine", B)
    assert theirs.status_code == 404, theirs.text
    assert theirs.json()["error"]["message"] == "Stream not found or expired"  # as if not there
    assert lookup(url, ["conv-mine"], B).json() == []
    # The other key's Stop is a 204, as for any id, and leaves the stream alone.
    assert stop(url, "conv-mine", B) == 204
    assert replay(url, "conv-mine", A).text == sse
    # The same id under the other key is a session of its own: the first is not replaced.
    other = start(url, "conv-mine", B, n=2)
    assert replay(url, "conv-mine", B).text == other != sse
    assert replay(url, "conv-mine", A).text == sse
    [entry] = lookup(url, ["conv-mine"], A).json()
    assert entry["conversation_id"] == "conv-mine" and entry["total_bytes"] == len(sse.encode())
    # Its owner's Stop forgets it; the other key's session of that id stays.
    assert stop(url, "conv-mine", A) == 204
    assert replay(url, "conv-mine", A).status_code == 404
    assert replay(url, "conv-mine", B).text == other
