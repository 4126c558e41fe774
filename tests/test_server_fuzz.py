"""Fuzzing the generation endpoints: >= 1000 generated bodies, no 5xx, /health stays ok.

Every generated body asks for at most 2 tokens (or is invalid), so the run stays short on a
2-core machine. The only 5xx llama-server documents for these endpoints are 501/503, which a
loaded server without --embeddings never gives here, so any 5xx fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer

FUZZ = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def client(model_path: Path) -> Iterator[httpx.Client]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    model = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    server = BackgroundServer(create_app(model, ServerSettings(max_body_bytes=256 * 1024)))
    server.start()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for _ in range(600):
            if http.get("/health").status_code == 200:
                break
            import time

            time.sleep(0.05)
        yield http
    server.stop()
    model.close()


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_any = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
# Either a small valid token budget or something that must be rejected.
n_tokens = st.one_of(
    st.integers(min_value=1, max_value=2),
    st.integers(max_value=-2),
    st.integers(min_value=2**31),
    st.sampled_from(["2", None, 1.5, True, [], {}]),
)
maybe = st.none()


def _options() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"n_predict": n_tokens},
        optional={
            "temperature": st.one_of(st.floats(-5, 5), json_leaf),
            "top_k": st.one_of(st.integers(-5, 100), json_leaf),
            "top_p": st.one_of(st.floats(-1, 2), json_leaf),
            "min_p": st.one_of(st.floats(-1, 2), json_leaf),
            "repeat_penalty": st.one_of(st.floats(0, 3), json_leaf),
            "seed": st.one_of(st.integers(-(2**40), 2**40), json_leaf),
            "stop": st.one_of(st.lists(st.text(max_size=5), max_size=3), json_leaf),
            "stream": st.one_of(st.booleans(), json_leaf),
            "n_probs": st.one_of(st.integers(-3, 5), json_leaf),
            "cache_prompt": st.one_of(st.booleans(), json_leaf),
            "grammar": st.one_of(st.just('root ::= "a"'), st.text(max_size=20)),
            "json_schema": st.one_of(st.just({"type": "object"}), json_any),
            "stream_options": st.one_of(st.just({"include_usage": True}), json_any),
            "junk": json_any,
        },
    )


prompts = st.one_of(
    st.text(max_size=60),
    st.lists(st.integers(-5, 300_000), max_size=6),
    st.lists(st.one_of(st.text(max_size=10), st.integers(0, 1000)), max_size=4),
    json_any,
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "bot", "", None, 3])
messages = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {"role": roles}, optional={"content": st.one_of(st.text(max_size=40), json_any)}
        ),
        max_size=4,
    ),
    json_any,
)


def _limit(body: dict[str, Any]) -> dict[str, Any]:
    # A valid-looking n_predict turned into max_tokens half the time (both names are aliases).
    if "n_predict" in body and isinstance(body["n_predict"], int) and body["n_predict"] % 2:
        body["max_tokens"] = body.pop("n_predict")
    return body


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    r = client.post(path, content=json.dumps(body))
    assert r.status_code < 500, (path, body, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["code"] == r.status_code and isinstance(error["message"], str)
        assert error["type"] in ("invalid_request_error", "exceed_context_size_error")
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("\n\n")
    else:
        r.json()


@FUZZ
@given(prompt=prompts, options=_options(), path=st.sampled_from(["/completion", "/v1/completions"]))
def test_fuzz_completion(client: httpx.Client, prompt: Any, options: dict, path: str):
    _post(client, path, _limit({"prompt": prompt, **options}))


@FUZZ
@given(
    msgs=messages,
    options=_options(),
    fmt=st.one_of(st.none(), json_any),
    logprobs=st.one_of(st.none(), st.booleans(), json_leaf),
    top=st.one_of(st.none(), st.integers(-2, 4), json_leaf),
)
def test_fuzz_chat(
    client: httpx.Client, msgs: Any, options: dict, fmt: Any, logprobs: Any, top: Any
):
    body = _limit({"messages": msgs, **options})
    if fmt is not None:
        body["response_format"] = fmt
    for key, value in (("logprobs", logprobs), ("top_logprobs", top)):
        if value is not None:
            body[key] = value
    _post(client, "/v1/chat/completions", body)


@FUZZ
@given(raw=st.binary(max_size=200))
def test_fuzz_raw_bytes(client: httpx.Client, raw: bytes):
    r = client.post("/v1/chat/completions", content=raw)
    assert r.status_code < 500, (raw, r.text)


def test_health_still_ok_after_fuzzing(client: httpx.Client):
    assert client.get("/health").json() == {"status": "ok"}
