"""`/infill` beside llama.cpp's own llama-server: the same prompt, token for token, on the test
model with FIM tokens (scripts/fim_model.py), and llama-server's errors."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.remote.conftest import ROOT, start
from tests.serverproc import ServerProcess

ARGS = ("-c", "512", "-b", "128", "-ub", "128", "-n", "64", "--temp", "0")


@pytest.fixture(scope="module")
def fim_model(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("fim_model", ROOT / "scripts/fim_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out: Path = module.write_fim_model(model_path, tmp_path_factory.mktemp("fim") / "fim.gguf")
    return out


@pytest.fixture(scope="module")
def servers(fim_model: Path) -> Iterator[dict[str, ServerProcess]]:
    running: dict[str, ServerProcess] = {}
    try:
        for kind in ("localfab", "llama-server"):
            running[kind] = start(kind, fim_model, *ARGS)
        yield running
    finally:
        for server in running.values():
            server.stop()


PREFIX = '#include <cstdio>\n#include "llama.h"\n\nint main() {\n'
LONG = "".join(f"    int value_{i} = compute({i}, {i * 7});\n" for i in range(40))
EXTRA = [
    {"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"},
    {"text": "static int helper(void) { return 42; }\n"},  # no filename: "tmp"
]

REQUESTS = {
    "plain": {"input_prefix": PREFIX, "prompt": "    int n = llama_", "input_suffix": "}\n"},
    "extra": {"input_prefix": PREFIX, "input_suffix": "}\n", "input_extra": EXTRA},
    # Past the budget: the prefix's end, the suffix's start and the context's end are kept.
    "long": {
        "input_prefix": PREFIX + LONG,
        "input_suffix": LONG + "}\n",
        "input_extra": [{"filename": f"f{i}.c", "text": LONG} for i in range(3)],
    },
    "mixed": {"input_prefix": [PREFIX, 107, "int x"], "input_suffix": ["}\n"]},
}


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/infill", json=body, timeout=120)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_prompt_and_reply_as_llama_server(servers: dict[str, ServerProcess], name: str) -> None:
    body = {**REQUESTS[name], "n_predict": 8, "temperature": 0, "cache_prompt": False}
    ours, theirs = (post(servers[k], body) for k in ("localfab", "llama-server"))
    assert ours.status_code == theirs.status_code == 200, ours.text
    a, b = ours.json(), theirs.json()
    assert a["prompt"] == b["prompt"]
    assert a["tokens_evaluated"] == b["tokens_evaluated"]
    assert a["content"] == b["content"]
    assert a["tokens_predicted"] == b["tokens_predicted"] == 8


def test_streamed(servers: dict[str, ServerProcess]) -> None:
    body = {**REQUESTS["extra"], "n_predict": 6, "temperature": 0, "stream": True}
    streamed = []
    with httpx.stream("POST", servers["localfab"].url + "/infill", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                streamed.append(line)
    assert len(streamed) >= 2 and '"stop":true' in streamed[-1]


BAD_EXTRA = [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"}, 7]


@pytest.mark.parametrize("chunk", BAD_EXTRA)
def test_bad_context_chunk_is_a_400(servers: dict[str, ServerProcess], chunk: Any) -> None:
    body = {**REQUESTS["plain"], "input_extra": [chunk]}
    ours, theirs = (post(servers[k], body) for k in ("localfab", "llama-server"))
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input_suffix": "x"}, '"input_prefix" is required'),
        ({"input_prefix": "x"}, '"input_suffix" is required'),
        ({"input_prefix": "x", "input_suffix": "y", "prompt": 5}, '"prompt" must be a string'),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": {}}, "must be an array"),
        ({"input_prefix": {"a": 1}, "input_suffix": "y"}, "must be a string or a list"),
    ],
)
def test_missing_or_wrong_field_is_a_400(
    servers: dict[str, ServerProcess], body: dict[str, Any], says: str
) -> None:
    # (llama-server answers the first three with a 500 or ignores them.)
    response = post(servers["localfab"], body)
    assert response.status_code == 400
    assert says in response.json()["error"]["message"]


def test_model_without_fim_tokens(model_path: Path) -> None:
    answers = {}
    for kind in ("localfab", "llama-server"):
        server = start(kind, model_path, "-c", "512")
        try:
            answers[kind] = post(server, REQUESTS["plain"])
        finally:
            server.stop()
    ours, theirs = answers["localfab"], answers["llama-server"]
    assert ours.status_code == theirs.status_code == 501
    assert ours.json() == theirs.json()
    assert ours.json()["error"]["message"].startswith("Infill is not supported by this model: ")
