"""llama-server's request surface over a real socket, on the real test model: prompt forms,
several results per request, logit_bias forms, progress, time limits, response_fields,
timings per token, __verbose, context overflow, bad input, /slots, /props and /metrics."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer
from tests.greedy import assert_follows
from tests.serverproc import serve

pytestmark = pytest.mark.model

N_CTX = 2048
N_BATCH = 512
SLOTS = 4
GREEDY = {"temperature": 0}
# Greedy and the whole prompt evaluated each time: tests that compare texts across requests use
# it, since a prompt evaluated in other batch sizes (part of it from the cache) can round
# differently and tip a greedy choice.
SAME = {"temperature": 0, "cache_prompt": False}


@pytest.fixture(scope="module", params=[1, SLOTS], ids=["one-sequence", "parallel-slots"])
def loaded(model_path: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The model with one sequence (jobs run one at a time), or with a sequence per slot (jobs
    decoded together): every request form must come out the same either way."""
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    n_seq = request.param
    settings = EngineSettings(n_ctx=N_CTX * n_seq, n_batch=N_BATCH, n_seq_max=n_seq)
    model = load_model(model_path, settings)
    assert model.engine.n_ctx == N_CTX
    yield model
    model.close()


@contextmanager
def running(loaded: Any, **settings: Any) -> Iterator[httpx.Client]:
    """A server on the shared model (one at a time: they share its engine)."""
    server = BackgroundServer(create_app(loaded, ServerSettings(**settings))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=300) as http:
            deadline = time.monotonic() + 60
            while http.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the server never became ready"
                time.sleep(0.05)
            yield http
    finally:
        server.stop()


@pytest.fixture(scope="module")
def http(loaded: Any) -> Iterator[httpx.Client]:
    with running(
        loaded, alias="surface", metrics=True, n_parallel=SLOTS, slots_debug=True
    ) as client:
        yield client


def events(text: str) -> list[Any]:
    """The JSON payloads of an SSE body ([DONE] kept as the string)."""
    assert text.endswith("\n\n")
    out = []
    for chunk in text[:-2].split("\n\n"):
        assert chunk.startswith("data: "), chunk
        data = chunk[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def complete(http: httpx.Client, path: str = "/completion", /, **body: Any) -> Any:
    res = http.post(path, json=body)
    assert res.status_code == 200, res.text
    return res.json()


def error(res: httpx.Response, code: int, type_: str) -> str:
    assert res.status_code == code, res.text
    body = res.json()["error"]
    assert body["code"] == code and body["type"] == type_
    return str(body["message"])


def tokens_of(http: httpx.Client, text: str, *, bos: bool) -> list[int]:
    return list(http.post("/tokenize", json={"content": text, "add_special": bos}).json()["tokens"])


PROMPT = "The capital of France is"


# --- prompt forms ---------------------------------------------------------------------------


def test_prompt_as_token_ids_and_mixed_give_the_string_prompts_text(http: httpx.Client) -> None:
    plain = complete(http, prompt=PROMPT, n_predict=8, **SAME)
    ids = tokens_of(http, PROMPT, bos=True)
    by_ids = complete(http, prompt=ids, n_predict=8, **SAME)
    assert by_ids["content"] == plain["content"] and plain["content"]
    assert by_ids["tokens_evaluated"] == plain["tokens_evaluated"] == len(ids)
    # A token first: the strings after it get no BOS of their own.
    head = tokens_of(http, "The capital", bos=True)
    mixed = complete(http, prompt=[*head, " of France is"], n_predict=8, **SAME)
    assert mixed["content"] == plain["content"]
    assert mixed["prompt"] == plain["prompt"]
    wrapped = complete(http, prompt={"prompt_string": PROMPT}, n_predict=8, **SAME)
    assert wrapped["content"] == plain["content"]
    # An image for a model that reads none: llama-server's 500 (a runtime error there).
    image = {"prompt_string": PROMPT + " <__media__>", "multimodal_data": ["iVBORw0KGgo="]}
    r = http.post("/completion", json={"prompt": image, "n_predict": 2})
    assert r.status_code == 500
    assert "does not support multimodal requests" in r.json()["error"]["message"]
    # In a chat, llama-server's 500 that names the missing projector; audio likewise.
    for part, kind in (
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            "image",
        ),
        ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, "audio"),
    ):
        content = [{"type": "text", "text": "What is this?"}, part]
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]}
        )
        assert r.status_code == 500, r.text
        assert r.json()["error"]["message"].startswith(f"{kind} input is not supported")
        assert "mmproj" in r.json()["error"]["message"]


def test_a_list_of_prompts_gives_one_result_each_in_order(http: httpx.Client) -> None:
    # With parallel slots the prompts of a list are decoded together: each result follows its
    # prompt's reply alone up to a near-tie (tests/greedy.py).
    prompts = ["Once upon a time", PROMPT, tokens_of(http, "1, 2, 3,", bos=True)]
    alone = [complete(http, prompt=p, n_predict=6, n_probs=2, **SAME) for p in prompts]
    together = complete(http, prompt=prompts, n_predict=6, **SAME)
    assert isinstance(together, list) and [r["index"] for r in together] == [0, 1, 2]
    for one, res in zip(alone, together, strict=True):
        assert_follows(one, res["content"])
    oai = complete(http, "/v1/completions", prompt=prompts, max_tokens=6, **SAME)
    assert [c["index"] for c in oai["choices"]] == [0, 1, 2]
    for one, choice in zip(alone, oai["choices"], strict=True):
        assert_follows(one, choice["text"])
    # Streamed: each result's chunks in turn, each with its index; one [DONE] at the end.
    res = http.post(
        "/v1/completions", json={"prompt": prompts[:2], "max_tokens": 6, "stream": True, **SAME}
    )
    chunks = events(res.text)
    assert chunks[-1] == "[DONE]" and "[DONE]" not in chunks[:-1]
    indexes = [c["choices"][0]["index"] for c in chunks[:-1]]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}
    texts = [
        "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"][0]["index"] == i)
        for i in (0, 1)
    ]
    for one, text in zip(alone[:2], texts, strict=True):
        assert_follows(one, text)
    native = events(
        http.post(
            "/completion", json={"prompt": prompts[:2], "n_predict": 6, "stream": True, **SAME}
        ).text
    )
    finals = [c for c in native if c["stop"]]
    assert [c["index"] for c in finals] == [0, 1]


def test_n_gives_n_choices_up_to_the_slots(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 5, **SAME}
    res = complete(http, "/v1/chat/completions", n=3, **body)
    choices = res["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    texts = {c["message"]["content"] for c in choices}
    assert len(texts) == 1 and texts.pop()  # greedy: the same reply three times
    # One answer: llama-server keeps the first result's envelope (usage, timings).
    assert res["usage"]["prompt_tokens"] > 0 and res["object"] == "chat.completion"
    message = error(
        http.post("/v1/chat/completions", json={**body, "n": SLOTS + 1}),
        400,
        "invalid_request_error",
    )
    assert f"Value must be between 1 <= value <= {SLOTS}, but got {SLOTS + 1}" in message


# --- sampling fields ------------------------------------------------------------------------


def test_logit_bias_in_every_form(http: httpx.Client) -> None:
    base = {"prompt": PROMPT, "n_predict": 1, **GREEDY, "return_tokens": True}
    first = complete(http, **base)["tokens"][0]
    piece = http.post("/detokenize", json={"tokens": [first]}).json()["content"]
    banned_forms = [
        {str(first): False},
        [[first, False]],
        [[piece, False]],
        {piece: -1000},
        [[first, -1000.0]],
    ]
    for form in banned_forms:
        res = complete(http, **base, logit_bias=form)
        assert res["tokens"] and res["tokens"][0] != first, form
        settings = res["generation_settings"]["logit_bias"]
        assert settings[0] in ({"bias": None, "token": first}, {"bias": -1000.0, "token": first})
    forced = tokens_of(http, " Berlin", bos=False)[0]
    res = complete(http, **base, logit_bias={str(forced): 100})
    assert res["tokens"][0] == forced
    bad = http.post("/completion", json={**base, "logit_bias": {"999999999": 1}})
    assert "out of the vocabulary" in error(bad, 400, "invalid_request_error")
    bad = http.post("/completion", json={**base, "logit_bias": [[first, "x"]]})
    assert "invalid bias" in error(bad, 400, "invalid_request_error")


def test_post_sampling_probs(http: httpx.Client) -> None:
    # llama-server's shape: `prob` and `top_probs`, from the candidates the sampler chain kept
    # (top_k=2 keeps two, which then hold all the probability).
    body = {"prompt": PROMPT, "n_predict": 2, "n_probs": 3, "post_sampling_probs": True}
    res = complete(http, **body, temperature=0.8, top_k=2)
    assert len(res["completion_probabilities"]) == 2
    for entry in res["completion_probabilities"]:
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"}
        token = entry["id"]
        assert len(entry["top_probs"]) == 2
        assert sum(t["prob"] for t in entry["top_probs"]) == pytest.approx(1.0)
        assert set(entry["top_probs"][0]) == {"id", "token", "bytes", "prob"}
        kept = {t["id"]: t["prob"] for t in entry["top_probs"]}
        assert entry["prob"] == pytest.approx(kept[token])
    # Greedy draws from nothing: the probabilities are the softmax of what the chain kept (the
    # whole vocabulary), so they match the pre-sampling ones.
    greedy = complete(http, **body, temperature=0)["completion_probabilities"][0]
    raw = complete(http, prompt=PROMPT, n_predict=2, n_probs=3, temperature=0)
    raw_first = raw["completion_probabilities"][0]
    assert [t["id"] for t in greedy["top_probs"]] == [t["id"] for t in raw_first["top_logprobs"]]
    assert greedy["prob"] == pytest.approx(math.exp(raw_first["logprob"]), rel=1e-4)


def test_post_sampling_probs_without_n_probs_is_accepted(http: httpx.Client) -> None:
    res = complete(http, prompt=PROMPT, n_predict=2, post_sampling_probs=True)
    assert res["generation_settings"]["post_sampling_probs"] is True
    assert "completion_probabilities" not in res


# --- streams: progress, timings per token ----------------------------------------------------


def test_return_progress_reports_prompt_processing(http: httpx.Client) -> None:
    prompt = "A lighthouse keeper writes the log. " * 160  # about 1,300 tokens: 3 batches
    body = {"prompt": prompt, "n_predict": 3, "stream": True, "return_progress": True,
            "cache_prompt": False, **GREEDY}  # fmt: skip
    chunks = events(http.post("/completion", json=body).text)
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    final = chunks[-1]
    total = final["tokens_evaluated"]
    assert total > 2 * N_BATCH
    assert all(p["total"] == total and p["cache"] == 0 for p in progress)
    done = [p["processed"] for p in progress]
    assert done[0] == 0 and done[-1] == total and done == sorted(done)
    assert len(done) == 2 + (total - 1) // N_BATCH  # start, after each batch but the last, end
    assert [p["time_ms"] for p in progress] == sorted(p["time_ms"] for p in progress)
    assert all(c["content"] == "" for c in chunks if "prompt_progress" in c)
    assert final["timings"]["prompt_n"] == total and final["timings"]["cache_n"] == 0
    # Again: the cached prompt is reported as cache.
    again = events(http.post("/completion", json={**body, "cache_prompt": True}).text)
    first = next(c["prompt_progress"] for c in again if "prompt_progress" in c)
    assert first["cache"] == total - 1 and first["processed"] == total - 1
    # Chat streams carry it on role chunks; without return_progress there is none.
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    chunks = events(http.post("/v1/chat/completions", json={**chat, "return_progress": True}).text)
    marked = [c for c in chunks[:-1] if "prompt_progress" in c]
    assert marked and all(
        c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in marked
    )
    plain = events(http.post("/v1/chat/completions", json=chat).text)
    assert not any("prompt_progress" in c for c in plain[:-1])


def test_timings_per_token(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "n_predict": 5, "stream": True, "timings_per_token": True,
            "ignore_eos": True, **GREEDY}  # fmt: skip
    chunks = events(http.post("/completion", json=body).text)
    partial = [c for c in chunks if not c["stop"]]
    assert [c["timings"]["predicted_n"] for c in partial] == [
        c["tokens_predicted"] for c in partial
    ]
    final = chunks[-1]["timings"]
    assert all(c["timings"]["prompt_n"] == final["prompt_n"] for c in partial)
    assert all(c["timings"]["cache_n"] == final["cache_n"] for c in partial)
    ms = [c["timings"]["predicted_ms"] for c in partial]
    assert ms == sorted(ms) and ms[-1] <= final["predicted_ms"] + 1e-6
    plain = events(http.post("/completion", json={**body, "timings_per_token": False}).text)
    assert not any("timings" in c for c in plain if not c["stop"])


def test_t_max_predict_ms_stops_after_a_newline(http: httpx.Client) -> None:
    body = {"prompt": "Count:\n1\n2\n3\n", "n_predict": 300, "ignore_eos": True, **GREEDY}
    limited = complete(http, **body, t_max_predict_ms=1)
    assert "\n" in limited["content"]
    assert limited["tokens_predicted"] < 300
    assert limited["stop_type"] == "limit" and limited["truncated"] is False
    # The reply stops at the first token after the first newline (each token takes > 1 ms).
    assert limited["content"].count("\n") == 1 or limited["content"].endswith("\n")
    full = complete(http, **{**body, "n_predict": 40})
    assert full["content"].startswith(limited["content"])


def test_response_fields_pick_and_unnest(http: httpx.Client) -> None:
    fields = ["content", "generation_settings/n_predict", "timings/predicted_n", "no/such"]
    res = complete(
        http, prompt=PROMPT, n_predict=3, ignore_eos=True, response_fields=fields, **GREEDY
    )
    assert set(res) == {"content", "generation_settings/n_predict", "timings/predicted_n"}
    assert res["generation_settings/n_predict"] == 3 and res["timings/predicted_n"] == 3
    bad = http.post("/completion", json={"prompt": PROMPT, "response_fields": "content"})
    assert "response_fields" in error(bad, 400, "invalid_request_error")


def test_verbose_field_only_when_started_verbose(loaded: Any, http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, **GREEDY}
    assert "__verbose" not in complete(http, "/v1/completions", **body)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **GREEDY}
    with running(loaded, verbose=True) as loud:
        res = complete(loud, "/v1/completions", **body)
        inner = res["__verbose"]
        assert inner["content"] == res["choices"][0]["text"] and inner["stop"] is True
        assert inner["generation_settings"]["n_predict"] == 3
        res = complete(loud, "/v1/chat/completions", **chat)
        assert res["__verbose"]["content"] == res["choices"][0]["message"]["content"]
        chunks = events(loud.post("/v1/completions", json={**body, "stream": True}).text)
        assert all("__verbose" in c for c in chunks[:-1])


# --- context overflow -----------------------------------------------------------------------


def _long_chat(turns: int) -> list[dict[str, str]]:
    filler = "The lamp was cleaned, the lens polished and the log written up again. " * 4
    messages = [{"role": "system", "content": "You keep a lighthouse."}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"Turn {i}: {filler}"},
            {"role": "assistant", "content": f"Noted {i}. {filler}"},
        ]
    return [*messages, {"role": "user", "content": "What now?"}]


def test_overflow_is_400_without_context_shift_and_turns_leave_with_it(
    loaded: Any, http: httpx.Client
) -> None:
    body = {"messages": _long_chat(24), "max_tokens": 4, **GREEDY}
    res = http.post("/v1/chat/completions", json=body)
    error(res, 400, "exceed_context_size_error")
    err = res.json()["error"]
    assert err["n_ctx"] == N_CTX and err["n_prompt_tokens"] > N_CTX
    assert err["message"] == (
        f"request ({err['n_prompt_tokens']} tokens) exceeds the available context size "
        f"({N_CTX} tokens), try increasing it"
    )
    long_prompt = http.post("/completion", json={"prompt": "word " * 2100, "n_predict": 2})
    error(long_prompt, 400, "exceed_context_size_error")
    with running(loaded, context_shift=True) as shifting:
        ok = complete(shifting, "/v1/chat/completions", **body)
        assert ok["context_shift"]["turns"] >= 1
        assert ok["usage"]["prompt_tokens"] < N_CTX


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": [2, 10**9]}, "invalid tokens"),
        ({"prompt": [2, -1]}, "invalid tokens"),
        ({"prompt": ["x"] * 10_000}, "10000 prompts"),
        ({"prompt": "x", "n_probs": -1}, "Field 'n_probs'"),
        ({"prompt": "x", "n_probs": 10**7}, "Field 'n_probs'"),
        ({"prompt": "x", "n": 99}, "Field 'n'"),
        ({"prompt": ["x"] * 100, "n": 4}, "400 results"),
        ({"prompt": [["x", "y"]]}, '"prompt" elements'),
        ({"prompt": []}, "must not be empty"),
    ],
)
def test_bad_input_is_a_clear_400(http: httpx.Client, body: dict[str, Any], needle: str) -> None:
    assert needle in error(http.post("/completion", json=body), 400, "invalid_request_error")


def test_after_bad_input_the_server_serves_and_slots_are_idle(http: httpx.Client) -> None:
    for body in ({"prompt": ["x"] * 10_000}, {"prompt": [10**9]}, {"prompt": "x", "n_probs": -5}):
        http.post("/completion", json=body)
    assert complete(http, prompt=PROMPT, n_predict=2)["stop"] is True
    assert not any(s["is_processing"] for s in http.get("/slots").json())


# --- /slots, /props, /metrics ----------------------------------------------------------------


def _wait_for(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_slots_show_the_running_request_then_idle(http: httpx.Client) -> None:
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(SLOTS))
    assert all(s["n_ctx"] == N_CTX for s in slots)
    body = {
        "prompt": "Once upon a time",
        "n_predict": 200,
        "ignore_eos": True,
        "stream": True,
        **GREEDY,
    }
    with httpx.stream("POST", str(http.base_url) + "/completion", json=body, timeout=300) as res:
        lines = res.iter_lines()
        _wait_for(lambda: next(lines).startswith("data: "))
        busy = _wait_for(lambda: [s for s in http.get("/slots").json() if s["is_processing"]])
        assert [s["id"] for s in busy] == [0]
        slot = busy[0]
        assert slot["prompt"].endswith("Once upon a time")
        assert slot["params"]["n_predict"] == 200
        assert slot["next_token"][0]["has_next_token"] is True
        assert 0 < slot["next_token"][0]["n_decoded"] <= 200
        for _ in lines:
            pass
    idle = http.get("/slots").json()
    assert not any(s["is_processing"] for s in idle)
    # Released: the counters reset, as llama-server's (the task's numbers stay).
    assert idle[0]["next_token"][0] == {
        "has_next_token": False,
        "has_new_line": idle[0]["next_token"][0]["has_new_line"],
        "n_remain": -1,
        "n_decoded": 0,
    }
    assert (
        idle[0]["n_prompt_tokens"]
        == idle[0]["n_prompt_tokens_processed"] + idle[0]["n_prompt_tokens_cache"]
    )


PROPS_KEYS = {
    "default_generation_settings", "total_slots", "model_alias", "model_ftype", "model_path",
    "modalities", "media_marker", "endpoint_slots", "endpoint_props", "endpoint_metrics", "ui",
    "ui_settings", "chat_template", "chat_template_caps", "bos_token", "eos_token",
    "build_info", "is_sleeping", "cors_proxy_enabled",
}  # fmt: skip


def test_props_has_llama_servers_keys_and_the_slot_context(http: httpx.Client) -> None:
    props = http.get("/props").json()
    assert set(props) == PROPS_KEYS
    assert props["total_slots"] == SLOTS and props["model_alias"] == "surface"
    assert props["default_generation_settings"]["n_ctx"] == N_CTX
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True


METRIC_NAMES = [
    ("prompt_tokens_total", "counter"),
    ("prompt_tokens_cached_total", "counter"),
    ("prompt_seconds_total", "counter"),
    ("tokens_predicted_total", "counter"),
    ("tokens_predicted_seconds_total", "counter"),
    ("n_decode_total", "counter"),
    ("n_tokens_max", "counter"),
    ("spec_decode_num_draft_tokens_total", "counter"),
    ("spec_decode_num_accepted_tokens_total", "counter"),
    ("spec_decode_num_drafts_total", "counter"),
    ("prompt_tokens_seconds", "gauge"),
    ("predicted_tokens_seconds", "gauge"),
    ("requests_processing", "gauge"),
    ("requests_deferred", "gauge"),
    ("n_busy_slots_per_decode", "gauge"),
]


def scrape(http: httpx.Client) -> tuple[dict[str, float], httpx.Response]:
    res = http.get("/metrics")
    assert res.status_code == 200
    values: dict[str, float] = {}
    lines = res.text.splitlines()
    for i, (name, kind) in enumerate(METRIC_NAMES):
        assert lines[3 * i].startswith(f"# HELP llamacpp:{name} ")
        assert lines[3 * i + 1] == f"# TYPE llamacpp:{name} {kind}"
        key, value = lines[3 * i + 2].split(" ")
        assert key == f"llamacpp:{name}"
        values[name] = float(value)
    # After llama-server's series, only localfab's own (the prompt cache's, when it is on).
    extra = lines[3 * len(METRIC_NAMES) :]
    assert all(
        line.startswith(("# HELP localfab:", "# TYPE localfab:", "localfab:")) for line in extra
    )
    return values, res


def test_metrics_after_a_known_sequence(loaded: Any) -> None:
    with running(loaded, metrics=True, n_parallel=2) as http:
        zero, res = scrape(http)
        assert all(v == 0 for v in zero.values())
        assert res.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert abs(int(res.headers["process-start-time-unix"]) - time.time()) < 3600
        body = {
            "prompt": "The keeper climbed the stairs",
            "n_predict": 8,
            "ignore_eos": True,
            **GREEDY,
        }
        first = complete(http, **body, cache_prompt=False)["timings"]
        second = complete(http, **body)["timings"]
        n = first["prompt_n"]
        assert first["cache_n"] == 0 and second["cache_n"] == n - 1 and second["prompt_n"] == 1
        m, _ = scrape(http)
        assert m["prompt_tokens_total"] == n + 1  # processed: all of the first, one of the second
        assert m["prompt_tokens_cached_total"] == n - 1
        assert m["tokens_predicted_total"] == 16
        assert m["n_decode_total"] == 1 + 7 + 1 + 7  # one prompt batch each, then 7 steps each
        assert m["n_tokens_max"] == n + 8
        ms = first["prompt_ms"] + second["prompt_ms"]
        assert m["prompt_seconds_total"] == pytest.approx(ms / 1e3, rel=1e-4)
        gen_ms = first["predicted_ms"] + second["predicted_ms"]
        assert m["tokens_predicted_seconds_total"] == pytest.approx(gen_ms / 1e3, rel=1e-4)
        # The rate counts decode steps: the first token of each reply came with its prompt.
        assert m["predicted_tokens_seconds"] == pytest.approx(14 / (gen_ms / 1e3), rel=1e-4)
        assert m["prompt_tokens_seconds"] == pytest.approx((n + 1) / (ms / 1e3), rel=1e-4)
        assert m["requests_processing"] == 0 and m["requests_deferred"] == 0
        assert m["n_busy_slots_per_decode"] == 1
        assert all(v == 0 for k, v in m.items() if k.startswith("spec_decode"))
        again, _ = scrape(http)  # the gauges average since the last scrape
        assert again["predicted_tokens_seconds"] == 0 and again["prompt_tokens_seconds"] == 0
        assert again["tokens_predicted_total"] == 16
        # While requests run they are processing (one at a time on one sequence, two on two
        # slots), and the next waits behind them.
        n_running = min(loaded.engine.n_seq_max, 2)
        stream = {"prompt": "Once", "n_predict": 300, "ignore_eos": True, "stream": True, **GREEDY}
        url = str(http.base_url) + "/completion"

        def run() -> None:
            with httpx.stream("POST", url, json=stream, timeout=300) as res:
                for _ in res.iter_lines():
                    pass

        threads = [threading.Thread(target=run) for _ in range(n_running + 1)]
        for t in threads:
            t.start()
        _wait_for(
            lambda: (
                (v := scrape(http)[0])["requests_deferred"] == 1
                and v["requests_processing"] == n_running
            )
        )
        for t in threads:
            t.join(300)
        after, _ = scrape(http)
        assert after["requests_processing"] == 0 and after["requests_deferred"] == 0
        assert after["tokens_predicted_total"] == 16 + 300 * (n_running + 1)
        assert math.isfinite(after["predicted_tokens_seconds"])


# --- concurrency and disconnects ------------------------------------------------------------


def test_concurrent_streams_get_the_text_they_get_alone(http: httpx.Client) -> None:
    prompts = ["Once upon a time", PROMPT, "The sea was", "My favourite food is"]
    body = {"n_predict": 12, "ignore_eos": True, **SAME}
    alone = [complete(http, prompt=p, n_probs=2, **body) for p in prompts]
    url = str(http.base_url) + "/completion"
    got: dict[int, str] = {}

    def run(i: int) -> None:
        with httpx.stream("POST", url, json={"prompt": prompts[i], "stream": True, **body},
                          timeout=300) as res:  # fmt: skip
            chunks = [json.loads(line[6:]) for line in res.iter_lines() if line]
        got[i] = "".join(c["content"] for c in chunks)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    # One at a time (one sequence) they are the same; decoded together (parallel slots) they
    # may part only at a near-tie (tests/greedy.py).
    for i, one in enumerate(alone):
        assert_follows(one, got[i])


@pytest.mark.parametrize("n_slots", [1, 4])
def test_disconnects_mid_stream_free_the_slot_and_leave_memory_flat(
    model_path: Any, n_slots: int
) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True}
    ctx = str(1024 * n_slots)
    with serve(model_path, "-c", ctx, "-t", "2", "--metrics", "-np", str(n_slots)) as server:
        url = server.url + "/completion"

        def leave_after_first_token() -> None:
            with httpx.stream("POST", url, json=body, timeout=120) as res:
                for line in res.iter_lines():
                    if line.startswith("data: "):
                        return

        for _ in range(10):  # allocator and caches settle first
            leave_after_first_token()
        before = server.rss()
        for _ in range(100):
            leave_after_first_token()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            _wait_for(lambda: not any(s["is_processing"] for s in http.get("/slots").json()))
            res = complete(http, prompt=PROMPT, n_predict=2)
            assert res["tokens_predicted"] == 2
            # Each abandoned reply stopped within a few tokens, not at its 400.
            predicted = scrape(http)[0]["tokens_predicted_total"]
            assert predicted < 110 * 20, predicted
        assert server.alive()
        assert server.rss() < before + 32 * 2**20, (before, server.rss())
