"""Fuzzing the generation endpoints: >= 1000 generated bodies, no 5xx, /health stays ok.

Every generated body asks for at most 2 tokens (or is invalid), and the server caps the rest
(-n 2), so the run stays short on a 2-core machine. The only 5xx llama-server documents for
these endpoints are 501/503, which a loaded server without --embeddings never gives here, so
any 5xx fails.

Each test gets its own server, with an empty KV cache, and checks /health itself at its end: no
test's outcome depends on which ran before it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer

pytestmark = [pytest.mark.model, pytest.mark.slow]

FUZZ = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def wait_healthy(http: httpx.Client, timeout: float = 60) -> None:
    """Return once /health answers 200; fail the test if it does not within `timeout`."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        r = http.get("/health")
        if r.status_code == 200:
            return
        last = f"{r.status_code} {r.text}"
        time.sleep(0.05)
    pytest.fail(f"the server did not become healthy within {timeout} s (last: {last})")


@pytest.fixture(scope="module")
def loaded(model_path: Path) -> Iterator[Any]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    model = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    yield model
    model.close()


@pytest.fixture()
def client(loaded: Any) -> Iterator[httpx.Client]:
    """A fresh server on the shared model, with an empty KV cache, for each test."""
    loaded.engine.clear_cache()
    # -n 2 is the limit of every reply whose body leaves it out or sets it to null (else a
    # reply could run to the end of the window, minutes on a busy machine); bodies here never
    # ask for -1 (no limit) or more than 2.
    settings = ServerSettings(max_body_bytes=256 * 1024, n_predict=2)
    server = BackgroundServer(create_app(loaded, settings))
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            wait_healthy(http)
            yield http
    finally:
        server.stop()


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


def assert_still_healthy(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 1


def test_fuzz_completion(client: httpx.Client):
    @FUZZ
    @given(
        prompt=prompts,
        options=_options(),
        path=st.sampled_from(["/completion", "/v1/completions"]),
    )
    def one(prompt: Any, options: dict, path: str) -> None:
        _post(client, path, _limit({"prompt": prompt, **options}))

    one()
    assert_still_healthy(client)


def test_fuzz_chat(client: httpx.Client):
    @FUZZ
    @given(
        msgs=messages,
        options=_options(),
        fmt=st.one_of(st.none(), json_any),
        logprobs=st.one_of(st.none(), st.booleans(), json_leaf),
        top=st.one_of(st.none(), st.integers(-2, 4), json_leaf),
    )
    def one(msgs: Any, options: dict, fmt: Any, logprobs: Any, top: Any) -> None:
        body = _limit({"messages": msgs, **options})
        if fmt is not None:
            body["response_format"] = fmt
        for key, value in (("logprobs", logprobs), ("top_logprobs", top)):
            if value is not None:
                body[key] = value
        _post(client, "/v1/chat/completions", body)

    one()
    assert_still_healthy(client)


def test_fuzz_raw_bytes(client: httpx.Client):
    @FUZZ
    @given(raw=st.binary(max_size=200))
    def one(raw: bytes) -> None:
        r = client.post("/v1/chat/completions", content=raw)
        assert r.status_code < 500, (raw, r.text)

    one()
    assert_still_healthy(client)


def test_a_server_that_never_gets_healthy_fails_the_fixture(loaded: Any):
    """The wait gives up with a failure, rather than handing the tests a server that is down."""
    gate = threading.Event()

    def stuck_loader() -> Any:
        gate.wait(60)
        return loaded

    stuck = BackgroundServer(create_app(stuck_loader, ServerSettings(), close_model=False))
    stuck.start()
    try:
        with (
            httpx.Client(base_url=stuck.url, timeout=10) as http,
            pytest.raises(pytest.fail.Exception, match="did not become healthy"),
        ):
            wait_healthy(http, timeout=0.5)
    finally:
        gate.set()
        stuck.stop()
