"""Vertex AI's custom-container contract (AIP_MODE=PREDICTION), as llama-server serves it: the
port and routes from the environment, instances dispatched by @requestFormat."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localfab.server.gcp import camel_name
from tests.serverproc import ServerProcess, free_port


def test_camel_names_as_llama_server() -> None:
    assert camel_name("/v1/chat/completions") == "chatCompletions"
    assert camel_name("/apply-template") == "applyTemplate"
    assert camel_name("/slots/{id_slot}") == "slots"
    assert camel_name("/completion") == "completion"
    assert camel_name("/v1/messages/count_tokens") == "messagesCountTokens"


@pytest.fixture(scope="module")
def vertex(model_path: Path) -> Iterator[ServerProcess]:
    aip_port = free_port()
    env = {
        **os.environ,
        "AIP_MODE": "PREDICTION",
        "AIP_HTTP_PORT": str(aip_port),
        "AIP_PREDICT_ROUTE": "score",  # the leading slash is added
        "AIP_HEALTH_ROUTE": "/ping",
    }
    server = ServerProcess(model_path, "-c", "1024", "-np", "2", env=env)
    server.url = f"http://127.0.0.1:{aip_port}"  # not --port: Vertex AI's port wins
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_predict_dispatches_each_instance(vertex: ServerProcess) -> None:
    chat = {"role": "user", "content": "Say hello"}
    instances = [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "messages": [chat]},
        {"@requestFormat": "/v1/completions", "prompt": "Once", "max_tokens": 3, "stream": True},
        {"@requestFormat": "tokenize", "content": "hello world"},
        {"@requestFormat": "nothing"},
        {"max_tokens": 3},
        "not an object",
        {"@requestFormat": "chatCompletions", "messages": []},
    ]
    r = httpx.post(vertex.url + "/score", json={"instances": instances}, timeout=120)
    assert r.status_code == 200, r.text
    p = r.json()["predictions"]
    assert len(p) == len(instances)
    assert p[0]["choices"][0]["message"]["role"] == "assistant"
    assert p[0]["choices"][0]["message"]["content"]
    assert p[1]["object"] == "text_completion"  # "stream" was forced off
    assert p[2]["tokens"] and all(isinstance(t, int) for t in p[2]["tokens"])
    assert p[3]["error"]["message"] == "no handler registered for @requestFormat: nothing"
    assert p[4]["error"]["message"] == "each instance must include a string @requestFormat"
    assert p[5]["error"]["message"] == "each instance must be a JSON object"
    assert p[6]["error"]["code"] == 400  # the endpoint's own error, as its prediction


def test_health_route_and_bad_bodies(vertex: ServerProcess) -> None:
    assert httpx.get(vertex.url + "/ping").json() == {"status": "ok"}
    bad = [{}, {"instances": 3}, {"instances": [{}] * 129}]
    for body in bad:
        r = httpx.post(vertex.url + "/score", json=body)
        assert r.status_code == 400
    assert "instances" in r.json()["error"]["message"]


def test_predict_route_that_shadows_an_endpoint_is_refused(
    model_path: Path, lf_env: dict[str, str]
) -> None:
    env = {**lf_env, "AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/completion"}
    port = str(free_port())
    done = subprocess.run(
        [str(Path(sys.executable).with_name("localfab")), "serve", str(model_path)]
        + ["--port", port, "-c", "256"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "AIP_PREDICT_ROUTE=/completion conflicts with an existing" in done.stderr
