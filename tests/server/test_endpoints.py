"""The server over a real socket: the openai client, raw HTTP shapes, errors, queue, cancel."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer

pytestmark = pytest.mark.model

KEY = "sk-test-key"


def _wait_ready(url: str, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(url + "/health", headers=headers)
        if r.status_code == 200:
            return
        time.sleep(0.05)
    raise RuntimeError("server never became ready")


@pytest.fixture(scope="module")
def loaded(model_path: Path) -> Iterator[Any]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    model = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    yield model
    model.close()


@pytest.fixture(scope="module")
def url(loaded: Any) -> Iterator[str]:
    # --context-shift: the long-chat tests below leave whole turns out (without it, a chat that
    # does not fit is a 400: tests/server/test_surface.py).
    settings = ServerSettings(
        alias="gemma-test", metrics=True, max_body_bytes=1024 * 1024, context_shift=True
    )
    server = BackgroundServer(create_app(loaded, settings)).start()
    _wait_ready(server.url)
    yield server.url
    server.stop()


@pytest.fixture()
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client


@pytest.fixture()
def oai(url: str) -> Any:
    import openai  # here: 68k objects that every collector pass of a fast-tier worker would walk

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, checking llama-server's `data: ...\\n\\n` framing."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


TIMING_KEYS = [
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
]


# --- openai client -------------------------------------------------------------------------


def test_openai_chat_completion(oai: Any) -> None:
    res = oai.chat.completions.create(
        model="gemma-test",
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=6,
        temperature=0,
    )
    assert res.object == "chat.completion"
    assert res.id.startswith("chatcmpl-") and len(res.id) == len("chatcmpl-") + 32
    assert res.model == "gemma-test"
    choice = res.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert res.usage.completion_tokens <= 6 and res.usage.prompt_tokens > 0
    assert list(res.model_extra["timings"]) == TIMING_KEYS


def test_openai_chat_stream_framing(oai: Any) -> None:
    stream = oai.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Count: one, two,"}],
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    first, *middle, final, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content is None
    assert all(c.choices[0].finish_reason is None for c in middle)
    assert final.choices[0].finish_reason == "length"
    assert final.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage.completion_tokens == 5
    assert "timings" in usage.model_extra and "timings" not in final.model_extra
    assert len({c.id for c in chunks}) == 1


def test_openai_chat_stream_without_usage(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
    r = http.post("/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"]
    assert "usage" not in last and list(last["timings"]) == TIMING_KEYS
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": None}


def test_openai_completions(oai: Any) -> None:
    res = oai.completions.create(model="x", prompt="The sky is", max_tokens=4, temperature=0)
    assert res.object == "text_completion"
    assert res.choices[0].finish_reason == "length"
    assert res.usage.completion_tokens == 4
    streamed = list(
        oai.completions.create(
            model="x", prompt="The sky is", max_tokens=4, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].text for c in streamed)
    assert text == res.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_openai_models(oai: Any) -> None:
    models = oai.models.list()
    assert [m.id for m in models.data] == ["gemma-test"]
    assert models.data[0].owned_by == "llamacpp"


def test_openai_error_is_400_with_body(oai: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "x " * 4000}], max_tokens=2
        )
    assert err.value.status_code == 400
    body: Any = err.value.body
    assert body["type"] == "exceed_context_size_error"
    assert body["n_ctx"] == 2048 and body["n_prompt_tokens"] > 2048


# --- native endpoints ---------------------------------------------------------------------


def test_native_completion_shape_and_prefix_reuse(http: httpx.Client) -> None:
    body = {"prompt": "Once upon a time, in a land far away,", "n_predict": 4, "temperature": 0}
    first = http.post("/completion", json=body).json()
    assert first["stop"] is True and first["stop_type"] == "limit"
    assert first["tokens_predicted"] == 4
    assert first["prompt"].startswith("<bos>Once upon")
    assert first["model"] == "gemma-test"
    assert first["generation_settings"]["n_predict"] == 4
    second = http.post("/completion", json=body).json()
    assert second["content"] == first["content"]
    assert second["timings"]["cache_n"] == first["tokens_evaluated"] - 1


def test_native_completion_stream_no_done(http: httpx.Client) -> None:
    body = {"prompt": "Hello", "n_predict": 3, "stream": True, "temperature": 0}
    events = [json.loads(e) for e in sse_events(http.post("/completion", json=body).text)]
    assert all(e["stop"] is False for e in events[:-1])
    assert len(events) == 4
    assert set(events[0]) == {
        "index",
        "content",
        "tokens",
        "stop",
        "id_slot",
        "tokens_predicted",
        "tokens_evaluated",
    }
    final = events[-1]
    assert final["stop"] is True and final["content"] == ""
    assert list(final["timings"]) == TIMING_KEYS


def test_stop_word_and_token_prompt(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"content": "1, 2, 3, 4,", "add_special": True}).json()
    res = http.post(
        "/completion",
        json={"prompt": tokens["tokens"], "n_predict": 12, "temperature": 0, "stop": [","]},
    ).json()
    assert res["stop_type"] == "word" and res["stopping_word"] == ","
    assert "," not in res["content"]


def test_prefill_continues_assistant_text(http: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "List three colours."},
        {"role": "assistant", "content": "Red, green and"},
    ]
    applied = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert applied.endswith("Red, green and")
    assert "<end_of_turn>\n<start_of_turn>model" not in applied[-40:]
    res = http.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "temperature": 0}
    )
    assert res.status_code == 200


def test_json_response_format_is_json(http: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "Give me a JSON object"}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}},
                    "required": ["a"],
                },
            },
        },
    }
    res = http.post("/v1/chat/completions", json=body).json()
    content = res["choices"][0]["message"]["content"]
    if res["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content)["a"], int)
    else:  # cut by max_tokens: still a JSON prefix
        assert content.lstrip().startswith("{")


def test_tokenize_detokenize_roundtrip(http: httpx.Client) -> None:
    toks = http.post("/tokenize", json={"content": "héllo 世界", "with_pieces": True}).json()
    ids = [t["id"] for t in toks["tokens"]]
    assert all(isinstance(t["piece"], str | list) for t in toks["tokens"])
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"content": "héllo 世界"}
    bad = http.post("/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400


def test_props_slots_metrics(http: httpx.Client) -> None:
    props = http.get("/props").json()
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == 2048
    assert props["model_alias"] == "gemma-test"
    slots = http.get("/slots").json()
    assert slots[0]["id"] == 0 and slots[0]["n_ctx"] == 2048
    metrics = http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "llamacpp:prompt_tokens_total " in metrics.text
    assert "# TYPE llamacpp:tokens_predicted_total counter" in metrics.text


def test_health_models_and_cors(http: httpx.Client) -> None:
    assert http.get("/v1/health").json() == {"status": "ok"}
    r = http.get("/models", headers={"Origin": "http://localhost:3000"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    opt = http.options("/v1/chat/completions", headers={"Origin": "http://127.0.0.1:5173"})
    assert opt.status_code == 200 and opt.text == ""
    assert opt.headers["access-control-allow-credentials"] == "true"
    assert opt.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert opt.headers["access-control-allow-headers"] == "*"
    # Another site's page may not read /slots (it holds the last prompt).
    r = http.get("/slots", headers={"Origin": "http://example.com"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    opt = http.options("/v1/chat/completions", headers={"Origin": "http://a.b"})
    assert opt.status_code == 200  # answered as llama-server's --cors-origins, without CORS:
    assert "access-control-allow-origin" not in opt.headers  # the browser sends nothing after
    assert "access-control-allow-credentials" not in opt.headers
    # DNS rebinding: a loopback server answers only loopback Host names.
    r = http.get("/slots", headers={"Host": "rebound.example.com"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


# --- errors ---------------------------------------------------------------------------------


def err(r: httpx.Response, code: int, type_: str) -> str:
    assert r.status_code == code, r.text
    body = r.json()["error"]
    assert body["code"] == code and body["type"] == type_
    return str(body["message"])


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/completion", {"prompt": "x", "n_predict": -5}, "Field 'n_predict'"),
        ("/completion", {"prompt": "x", "max_tokens": 10**12}, "Field 'max_tokens'"),
        ("/completion", {"prompt": "x", "temperature": "hot"}, "type must be number"),
        ("/completion", {"prompt": "x", "stream": 1}, "type must be boolean"),
        ("/completion", {"prompt": [1, 2, 10**9]}, "invalid tokens"),
        ("/completion", {"prompt": {"a": 1}}, '"prompt" elements'),
        ("/completion", {"n_predict": 2}, "'prompt'"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, "role"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/chat/completions", {}, "'messages' is required"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
            "response_format",
        ),
    ],
)
def test_bad_requests_are_400(
    http: httpx.Client, path: str, body: dict[str, Any], needle: str
) -> None:
    assert needle in err(http.post(path, json=body), 400, "invalid_request_error")


def test_malformed_and_huge_bodies(http: httpx.Client) -> None:
    err(http.post("/completion", content=b"{not json"), 400, "invalid_request_error")
    err(http.post("/completion", content=b"[1, 2]"), 400, "invalid_request_error")
    err(http.post("/completion", content=b'{"prompt": NaN}'), 400, "invalid_request_error")
    huge = b'{"prompt": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    r = http.post("/completion", content=huge)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    assert http.get("/health").json() == {"status": "ok"}


def test_not_found_and_not_supported(http: httpx.Client) -> None:
    msg = err(http.get("/nope"), 404, "not_found_error")
    assert msg == "File Not Found"
    err(http.get("/completion"), 404, "not_found_error")
    err(http.post("/v1/embeddings", json={"input": "x"}), 501, "not_supported_error")


# --- queue, cancel -------------------------------------------------------------------------


def test_concurrent_requests_all_answered(url: str) -> None:
    results: dict[int, dict[str, Any]] = {}

    def one(i: int) -> None:
        body = {"prompt": f"Request number {i}:", "n_predict": 3, "temperature": 0}
        results[i] = httpx.post(url + "/completion", json=body, timeout=300).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(6))
    assert all(r["tokens_predicted"] == 3 for r in results.values())
    alone = httpx.post(
        url + "/completion",
        json={"prompt": "Request number 4:", "n_predict": 3, "temperature": 0},
        timeout=60,
    ).json()
    assert alone["content"] == results[4]["content"]


def wait_slot_idle(http: httpx.Client, id_task: int, timeout: float = 300) -> dict[str, Any]:
    """/slots' slot 0 once the job `id_task` is no longer processing (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slot = http.get("/slots").json()[0]
        assert slot["id_task"] == id_task, slot  # nothing else runs during the test
        if not slot["is_processing"]:
            return dict(slot)
        time.sleep(0.05)
    raise AssertionError(f"job {id_task} still generating after {timeout} s")


def predicted_total(http: httpx.Client) -> int:
    text = http.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total "))
    return int(float(line.split()[1]))


def test_disconnect_stops_generation(url: str, http: httpx.Client) -> None:
    n_predict = 1500
    before = predicted_total(http)
    host, port = url.removeprefix("http://").split(":")
    # ignore_eos: left alone, the reply would run to exactly n_predict tokens.
    body = json.dumps(
        {"prompt": "Tell a long story:", "n_predict": n_predict, "stream": True,
         "ignore_eos": True}
    )  # fmt: skip
    raw = (
        f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(raw)
        received = b""
        while b"data: " not in received:  # headers may arrive before the first event
            chunk = sock.recv(4096)
            assert chunk, "the stream closed before its first event"
            received += chunk
        running = http.get("/slots").json()[0]
        assert running["is_processing"], running
    stopped = wait_slot_idle(http, running["id_task"])
    assert "prompt" not in stopped  # without LLAMA_SERVER_SLOTS_DEBUG, as llama-server
    n_decoded = predicted_total(http) - before
    assert 1 <= n_decoded < n_predict // 2  # the story was abandoned, not finished
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 1


def test_slow_client_times_out(loaded: Any) -> None:
    settings = ServerSettings(read_timeout=0.5)
    server = BackgroundServer(create_app(loaded, settings)).start()
    try:
        _wait_ready(server.url)
        host, port = server.host, server.port
        with socket.create_connection((host, port)) as sock:
            sock.sendall(
                b'POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"pro'
            )
            sock.settimeout(10)
            data = sock.recv(4096)
        assert b" 408 " in data.split(b"\r\n")[0]
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()


# --- API key, loading ------------------------------------------------------------------------


def test_api_key_rules(loaded: Any) -> None:
    import openai

    settings = ServerSettings(api_keys=("other", KEY))
    server = BackgroundServer(create_app(loaded, settings)).start()
    try:
        _wait_ready(server.url)
        base = server.url
        assert httpx.get(base + "/health").status_code == 200  # public
        msg = err(httpx.get(base + "/v1/models"), 401, "authentication_error")
        assert msg == "Invalid API Key"
        err(httpx.get(base + "/v1/models", headers={"Authorization": "Bearer no"}), 401,
            "authentication_error")  # fmt: skip
        assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success
        assert httpx.get(base + "/v1/models", headers={"X-Api-Key": KEY}).is_success
        # A key does not open the server to other origins' pages.
        r = httpx.get(base + "/v1/models", headers={"X-Api-Key": KEY, "Origin": "http://e.com"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        assert client.models.list().data
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="bad", max_retries=0).models.list()
    finally:
        server.stop()


def test_health_503_while_loading(loaded: Any) -> None:
    gate = threading.Event()

    def slow_loader() -> Any:
        gate.wait(30)
        return loaded

    server = BackgroundServer(create_app(slow_loader, ServerSettings(), close_model=False)).start()
    try:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503
        assert r.json() == {
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
        }
        gate.set()
        _wait_ready(server.url)
    finally:
        server.stop()


@pytest.mark.slow  # hundreds of tokens past a full window
def test_context_shift_keeps_generating(loaded: Any) -> None:
    """With --context-shift a reply that fills the window goes on; without, it stops there."""
    prompt = "word " * 1990
    body = {"prompt": prompt, "n_predict": 80, "temperature": 0, "ignore_eos": True}
    plain = BackgroundServer(create_app(loaded, ServerSettings())).start()
    try:
        _wait_ready(plain.url)
        res = httpx.post(plain.url + "/completion", json=body, timeout=300).json()
        assert res["truncated"] is True and res["tokens_predicted"] < 80
    finally:
        plain.stop()
    shifting = BackgroundServer(create_app(loaded, ServerSettings(context_shift=True))).start()
    try:
        _wait_ready(shifting.url)
        res = httpx.post(shifting.url + "/completion", json=body, timeout=300).json()
        # It went on to its n_predict; truncated says the window moved, as llama-server's.
        assert res["tokens_predicted"] == 80 and res["truncated"] is True
        # A chat with one turn has no whole turn to give: it falls back to the same shift.
        chat = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 80,
            "temperature": 0,
            "ignore_eos": True,
        }
        res = httpx.post(shifting.url + "/v1/chat/completions", json=chat, timeout=300).json()
        assert res["usage"]["completion_tokens"] == 80 and "context_shift" not in res
    finally:
        shifting.stop()


def test_penalties_and_logit_bias_change_the_output(http: httpx.Client) -> None:
    base = {"prompt": "The history of the city of Rome", "n_predict": 16, "temperature": 0}
    plain = http.post("/completion", json=base).json()
    penalized = http.post("/completion", json=base | {"repeat_penalty": 1.5}).json()
    assert penalized["content"] and penalized["content"] != plain["content"]
    first = http.post("/tokenize", json={"content": plain["content"]}).json()["tokens"][0]
    banned = http.post("/completion", json=base | {"logit_bias": [[first, False]]}).json()
    assert not banned["content"].startswith(plain["content"][:3])
    assert banned["generation_settings"]["logit_bias"] == [{"bias": None, "token": first}]
    # ignore_eos bans the end-of-generation tokens, shown as llama-server shows them.
    endless = http.post("/completion", json=base | {"ignore_eos": True}).json()
    eog = endless["generation_settings"]["logit_bias"]
    assert eog and all(e["bias"] is None for e in eog) and 1 in {e["token"] for e in eog}
    bad = http.post("/completion", json=base | {"logit_bias": [[10**9, 1.0]]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def _check_entries(entries: list[dict[str, Any]], n_top: int) -> None:
    """llama-server's per-token probability entries: greedy picks the top token."""
    for e in entries:
        assert set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        top = e["top_logprobs"]
        assert len(top) == n_top and all(set(t) == {"id", "token", "bytes", "logprob"} for t in top)
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-6
        assert top[0]["id"] == e["id"] and top[0]["logprob"] == pytest.approx(e["logprob"])
        assert e["logprob"] <= 0
        assert bytes(e["bytes"]).decode("utf-8", errors="ignore").startswith(e["token"][:1])


def test_native_n_probs(http: httpx.Client) -> None:
    # Each request evaluates its whole prompt: a prompt taken from the cache is computed in
    # other batches, whose logits differ in the last bits (as llama-server says of cache_prompt).
    body = {
        "prompt": "The capital of France is",
        "n_predict": 4,
        "temperature": 0,
        "n_probs": 3,
        "cache_prompt": False,
    }
    res = http.post("/completion", json=body).json()
    entries = res["completion_probabilities"]
    assert len(entries) == 4 and "".join(e["token"] for e in entries) == res["content"]
    _check_entries(entries, 3)
    assert res["generation_settings"]["n_probs"] == 3

    events = [
        json.loads(e)
        for e in sse_events(http.post("/completion", json={**body, "stream": True}).text)
    ]
    partial = [e["completion_probabilities"] for e in events[:-1]]
    assert all(len(p) == 1 for p in partial) and "completion_probabilities" not in events[-1]
    assert [p[0] for p in partial] == entries  # the same numbers, streamed or not

    plain = http.post("/completion", json={**body, "n_probs": 0}).json()
    assert "completion_probabilities" not in plain


def test_n_probs_leave_out_the_stop_string(http: httpx.Client) -> None:
    body = {"prompt": "1, 2, 3, 4,", "n_predict": 12, "temperature": 0, "n_probs": 2}
    res = http.post("/completion", json={**body, "stop": [","]}).json()
    assert res["stop_type"] == "word"
    assert len(res["completion_probabilities"]) == res["tokens_predicted"] - 1


def test_openai_logprobs(oai: Any) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    res = oai.chat.completions.create(
        model="x", messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = res.choices[0].logprobs.content
    assert len(content) == res.usage.completion_tokens
    assert "".join(c.token for c in content) == res.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token
        assert c.logprob == pytest.approx(c.top_logprobs[0].logprob) and c.logprob <= 0
    _check_entries([c.model_dump() for c in content], 2)

    stream = oai.chat.completions.create(
        model="x",
        messages=messages,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    streamed = [e for ch in stream if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]  # fmt: skip
    assert [(e.token, e.logprob) for e in streamed] == [(c.token, c.logprob) for c in content]

    default = oai.chat.completions.create(
        model="x", messages=messages, max_tokens=2, temperature=0, logprobs=True
    )
    assert all(len(c.top_logprobs) == 20 for c in default.choices[0].logprobs.content)
    assert (
        oai.chat.completions.create(model="x", messages=messages, max_tokens=2, temperature=0)
        .choices[0]
        .logprobs
        is None
    )

    legacy = oai.completions.create(
        model="x", prompt="The sky is", max_tokens=3, temperature=0, logprobs=2
    )
    _check_entries(legacy.choices[0].logprobs.model_extra["content"], 2)


@pytest.mark.slow  # hundreds of tokens past a full window
def test_long_chat_leaves_out_whole_old_turns(loaded: Any, http: httpx.Client) -> None:
    """A chat longer than the window keeps the system prompt and the last turns, and says so."""
    engine = loaded.engine
    system = "You are the assistant of a lighthouse keeper."
    filler = "The lamp was cleaned, the lens polished and the log written up again. " * 4
    messages = [{"role": "system", "content": system}]
    for i in range(24):
        messages += [
            {"role": "user", "content": f"Turn {i}: {filler}"},
            {"role": "assistant", "content": f"Noted for turn {i}. {filler}"},
        ]
    messages.append({"role": "user", "content": "What should I do now?"})
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    res = http.post("/v1/chat/completions", json=body)
    assert res.status_code == 200, res.text
    first = res.json()
    shift = first["context_shift"]
    assert shift["turns"] >= 1 and shift["tokens"] > 0
    assert first["usage"]["prompt_tokens"] <= engine.n_ctx - 8
    window = engine.detokenize(engine.cached_tokens, special=True)
    assert window.startswith(f"<bos><start_of_turn>user\n{system}\n\n")
    assert "What should I do now?" in window and "Turn 0:" not in window
    kept = window.index("Turn ") + len("Turn ")
    first_kept = int(window[kept : window.index(":", kept)])
    assert first_kept == shift["turns"]  # whole turns, oldest first

    # The next request outgrows the window again: the kept turns come from the KV cache.
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": f"And after that? {filler}"},
    ]
    again = http.post("/v1/chat/completions", json={**body, "messages": messages}).json()
    assert again["context_shift"]["turns"] > shift["turns"]
    timings = again["timings"]
    assert timings["cache_n"] > 1000 and timings["prompt_n"] < 200

    # Streamed, the last chunk says it; a chat that fits says nothing.
    stream = http.post("/v1/chat/completions", json={**body, "stream": True})
    events = sse_events(stream.text)
    assert json.loads(events[-2])["context_shift"] == again["context_shift"]
    short = http.post("/v1/chat/completions", json={**body, "messages": messages[-1:]}).json()
    assert "context_shift" not in short


@pytest.mark.slow  # hundreds of tokens past a full window
def test_chat_reply_that_fills_the_window_goes_on(loaded: Any, http: httpx.Client) -> None:
    engine = loaded.engine
    filler = "The keeper trimmed the wick and wound the clockwork of the lamp. " * 4
    messages: list[dict[str, str]] = [{"role": "system", "content": "Be thorough."}]
    for i in range(12):
        messages += [
            {"role": "user", "content": f"Turn {i}: {filler}"},
            {"role": "assistant", "content": filler},
        ]
    messages.append({"role": "user", "content": "Write the whole log book."})
    body = {"messages": messages, "max_tokens": 700, "temperature": 0, "ignore_eos": True}
    res = http.post("/v1/chat/completions", json=body).json()
    assert res["usage"]["completion_tokens"] == 700
    assert res["choices"][0]["finish_reason"] == "length"
    # The prompt and the reply together outgrow the window: turns left during the reply too.
    assert res["usage"]["prompt_tokens"] + 700 > engine.n_ctx
    assert res["context_shift"]["turns"] >= 2
    window = engine.detokenize(engine.cached_tokens, special=True)
    assert window.startswith("<bos><start_of_turn>user\nBe thorough.\n\n")
    assert "Write the whole log book." in window
