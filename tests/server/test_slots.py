"""Parallel slots over a real socket: streams decoded together, prefix-affine slots, `n` copies,
chunked prefill, disconnects, overflow per slot, /slots, /props and /metrics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer
from tests.greedy import NEAR_TIE, assert_follows

pytestmark = pytest.mark.model

N_SLOTS = 4
N_CTX = 8192  # 2048 per slot
PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The history of the printing press begins",
]


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(url + "/health").status_code == 200:
            return
        time.sleep(0.05)
    raise RuntimeError("server never became ready")


def _serve(model_path: Path, n_ctx: int = N_CTX, **settings: Any) -> tuple[Any, BackgroundServer]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    unified = settings.pop("kv_unified", False)
    speculative = settings.pop("speculative", None)
    loaded = load_model(
        model_path,
        EngineSettings(n_ctx=n_ctx, n_batch=512, n_seq_max=N_SLOTS, kv_unified=unified),
        speculative=speculative,
    )
    server = BackgroundServer(
        create_app(loaded, ServerSettings(n_parallel=N_SLOTS, metrics=True, slots=True, **settings))
    ).start()
    _wait_ready(server.url)
    return loaded, server


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    loaded, server = _serve(model_path)
    yield server.url
    server.stop()
    loaded.close()


def complete(url: str, prompt: Any, n: int = 32, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, **extra}
    r = httpx.post(url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def stream_tokens(url: str, prompt: str, n: int, out: list[tuple[float, str]]) -> None:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                if not chunk.get("stop"):
                    out.append((time.perf_counter(), chunk["content"]))


def slots(url: str) -> list[dict[str, Any]]:
    return list(httpx.get(url + "/slots").json())


def wait_idle(url: str, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        state = slots(url)
        if not any(s["is_processing"] for s in state) or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split()
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def test_concurrent_streams_run_together_with_the_text_each_gets_alone(url: str) -> None:
    """Each of 4 streams decoded together gets the greedy tokens it gets alone, up to the first
    near-tie of its own logits (where the last bits of a batched kernel may choose the other
    token); a stream given another slot's cells or logits would differ at a clear choice."""
    alone = [complete(url, p, cache_prompt=False, n_probs=2) for p in PROMPTS]
    results: list[dict[str, Any]] = [{} for _ in PROMPTS]
    seen_busy: list[int] = []

    def go(i: int) -> None:
        results[i] = complete(url, PROMPTS[i], cache_prompt=False, n_probs=2)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen_busy.append(sum(s["is_processing"] for s in slots(url)))
        time.sleep(0.01)
    for t in threads:
        t.join()
    # Decoded together, not one after another: several slots were busy at once.
    assert max(seen_busy) >= 2
    same = 0
    for one, together in zip(alone, results, strict=True):
        assert together["tokens_predicted"] == 32
        probs = one["completion_probabilities"]
        a = [p["id"] for p in probs]
        b = [p["id"] for p in together["completion_probabilities"]]
        k = first_difference(a, b)
        if k is None:
            same += 1
            continue
        top = probs[k]["top_logprobs"]
        margin = top[0]["logprob"] - top[1]["logprob"]
        assert margin < NEAR_TIE, f"differs at token {k}, a clear choice (margin {margin:.3f})"
    assert same >= 2


def test_n_copies_evaluate_the_prompt_once(url: str) -> None:
    body = {
        "prompt": "A list of rivers in Europe:",
        "max_tokens": 12,
        "temperature": 0,
        "n": 3,
        "cache_prompt": False,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["text"] for c in choices}) == 1  # greedy: the same text three times
    assert choices[0]["text"]
    state = wait_idle(url)
    # One slot processed the prompt; the two others got its cells copied.
    processed = sorted(s.get("n_prompt_tokens_processed", -1) for s in state)
    n_prompt = max(s.get("n_prompt_tokens", 0) for s in state)
    assert processed.count(0) >= 2 and n_prompt in processed


def test_a_prompt_goes_to_the_slot_that_has_its_prefix(url: str) -> None:
    base = "The lighthouse keeper counted the ships that passed the rocky cape each night, " * 4
    first = complete(url, base, n=4)
    # Other prompts in between take other slots (least recently used first)...
    for p in PROMPTS[:2]:
        complete(url, p + " and more", n=4)
    again = complete(url, base + "Tonight there were", n=4)
    n_base = first["tokens_evaluated"]
    # ...and the longer prompt comes back to the slot holding its prefix.
    assert again["timings"]["cache_n"] >= n_base - 1
    assert again["timings"]["prompt_n"] <= again["tokens_evaluated"] - n_base + 1


def test_a_long_prompt_does_not_freeze_running_streams(url: str) -> None:
    outs: list[list[tuple[float, str]]] = [[] for _ in range(3)]
    threads = [
        threading.Thread(target=stream_tokens, args=(url, PROMPTS[i], 96, outs[i]))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while any(len(o) < 2 for o in outs) and time.monotonic() < deadline:
        time.sleep(0.01)
    long_prompt = "Every river in the valley ran toward the sea, and " * 120  # ~1,400 tokens
    t0 = time.perf_counter()
    long = complete(url, long_prompt, n=4, cache_prompt=False)
    t1 = time.perf_counter()
    for t in threads:
        t.join()
    assert long["tokens_predicted"] == 4
    assert long["timings"]["prompt_n"] > 1000
    # The streams went on while the long prompt was being processed (chunks of it shared
    # steps with their tokens), and each got its full reply.
    assert all(len(o) == 96 for o in outs)
    during = [sum(1 for ts, _ in o if t0 < ts < t1) for o in outs]
    assert all(n > 0 for n in during), during


def test_a_client_that_leaves_frees_its_slot(url: str) -> None:
    body = {"prompt": "Tell me a long story", "n_predict": 1500, "stream": True, "ignore_eos": True}
    busy_while_reading = False
    with httpx.stream("POST", url + "/completion", json=body, timeout=60) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i == 4:
                busy_while_reading = any(s["is_processing"] for s in slots(url))
                break  # closes the connection mid-stream
    assert busy_while_reading
    state = wait_idle(url, timeout=10)
    assert not any(s["is_processing"] for s in state)
    # Stopped where the client left, not run to its 1,500 tokens.
    assert max(s.get("next_token", [{}])[0].get("n_decoded", 0) for s in state) < 1000
    assert metrics(url)["requests_processing"] == 0


def test_slots_props_and_metrics_show_the_slots(url: str) -> None:
    wait_idle(url)
    state = slots(url)
    assert [s["id"] for s in state] == list(range(N_SLOTS))
    assert all(s["n_ctx"] == N_CTX // N_SLOTS for s in state)
    props = httpx.get(url + "/props").json()
    assert props["total_slots"] == N_SLOTS
    assert props["default_generation_settings"]["n_ctx"] == N_CTX // N_SLOTS
    before = metrics(url)
    done = [complete(url, p + " again", n=8, cache_prompt=False) for p in PROMPTS[:2]]
    after = metrics(url)
    predicted = sum(d["tokens_predicted"] for d in done)
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == predicted
    prompt_n = sum(d["timings"]["prompt_n"] for d in done)
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == prompt_n
    # Two requests one after another: each step held one busy slot.
    assert after["n_decode_total"] - before["n_decode_total"] >= predicted - 2
    assert after["requests_processing"] == 0


def test_a_prompt_over_the_slot_context_is_refused_as_llama_server_does(url: str) -> None:
    tokens = [2] + [651] * (N_CTX // N_SLOTS + 10)
    r = httpx.post(url + "/completion", json={"prompt": tokens, "n_predict": 4}, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == N_CTX // N_SLOTS


def test_a_reply_past_the_slot_context_shifts_with_context_shift(model_path: Path) -> None:
    n_slot = 256
    loaded, server = _serve(model_path, n_ctx=n_slot * N_SLOTS, context_shift=True)
    try:
        prompt = "Count: " + " ".join(str(i) for i in range(60))
        outs: list[dict[str, Any]] = [{}, {}]

        def go(i: int) -> None:
            outs[i] = complete(server.url, prompt, n=n_slot, ignore_eos=True)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for out in outs:
            # More tokens than one slot holds with its prompt: the slot shifted and went on.
            assert out["tokens_predicted"] == n_slot
            assert out["tokens_evaluated"] + out["tokens_predicted"] > n_slot
    finally:
        server.stop()
        loaded.close()


def test_kv_unified_slots_share_one_pool_and_a_full_pool_ends_a_reply_cleanly(
    model_path: Path,
) -> None:
    pool = 1024
    loaded, server = _serve(model_path, n_ctx=pool, kv_unified=True)
    try:
        # Every slot may use the whole pool...
        assert all(s["n_ctx"] == pool for s in slots(server.url))
        outs: list[dict[str, Any]] = [{} for _ in range(3)]

        def go(i: int) -> None:
            outs[i] = complete(server.url, f"Story {i}:", n=500, ignore_eos=True)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # ...but three 500-token replies do not fit 1,024 cells together: the youngest stops
        # where the pool ran out (its text kept, as a length stop), the others go on.
        assert all(o["stop_type"] == "limit" for o in outs)
        cut = [o for o in outs if o["tokens_predicted"] < 500]
        assert 1 <= len(cut) <= 2 and all(o["content"] for o in cut)
        assert any(o["tokens_predicted"] == 500 for o in outs)
        # Together they used more than the pool: the cut reply's cells went back to it.
        assert sum(o["tokens_evaluated"] + o["tokens_predicted"] for o in outs) > pool
        # The pool is usable again at once (idle slots' cells are given up when needed).
        assert complete(server.url, "Hello", n=4)["tokens_predicted"] == 4
    finally:
        server.stop()
        loaded.close()


def test_200_requests_at_once_queue_for_the_slots_and_all_are_answered(url: str) -> None:
    answers: list[int] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        body = {"prompt": f"Item {i}:", "n_predict": 2, "ignore_eos": True}
        r = httpx.post(url + "/completion", json=body, timeout=300)
        with lock:
            answers.append(r.status_code)

    before = metrics(url)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    deferred = 0.0
    while any(t.is_alive() for t in threads):
        deferred = max(deferred, metrics(url)["requests_deferred"])
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert answers == [200] * 200
    assert deferred > 0  # more requests than slots: the rest waited their turn
    after = metrics(url)
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == 400
    assert after["requests_processing"] == 0 and after["requests_deferred"] == 0
    assert not any(s["is_processing"] for s in wait_idle(url))


def test_id_slot_pins_a_request_to_a_slot_and_every_answer_names_its_slot(url: str) -> None:
    prompt = "The observatory's dome opened slowly while the astronomer checked the sky"
    first = complete(url, prompt, n=4, id_slot=2)
    assert first["id_slot"] == 2
    state = wait_idle(url)
    assert state[2]["n_prompt_tokens"] == first["tokens_evaluated"]
    # As llama-server, an id past the last slot wraps around; the pinned slot's cache serves it.
    again = complete(url, prompt + " again", n=4, id_slot=2 + N_SLOTS)
    assert again["id_slot"] == 2
    assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 2
    # Without id_slot, the answer says which slot ran it.
    free = complete(url, "A short unrelated line", n=2)
    assert 0 <= free["id_slot"] < N_SLOTS
    assert slots(url)[free["id_slot"]]["n_prompt_tokens"] == free["tokens_evaluated"]
    bad = httpx.post(url + "/completion", json={"prompt": "x", "id_slot": -2}, timeout=30)
    assert bad.status_code == 400


def test_a_step_that_raises_fails_its_requests_and_the_slots_go_on(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localfab.engine.batch import BatchDecoder

    real = BatchDecoder.step
    calls = [0]

    def flaky(self: BatchDecoder) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("boom")
        return real(self)

    monkeypatch.setattr(BatchDecoder, "step", flaky)
    r = httpx.post(url + "/completion", json={"prompt": "Hello", "n_predict": 10}, timeout=60)
    assert r.status_code == 500
    assert "boom" in r.json()["error"]["message"]
    assert not any(s["is_processing"] for s in wait_idle(url))
    assert complete(url, "Hello there", n=3)["tokens_predicted"] == 3


def test_a_grammar_dead_end_ends_only_its_own_reply(url: str) -> None:
    outs: list[list[tuple[float, str]]] = [[]]
    running = threading.Thread(target=stream_tokens, args=(url, PROMPTS[0], 64, outs[0]))
    running.start()
    deadline = time.monotonic() + 60
    while len(outs[0]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # "a", then a character no token has: the second token has no candidate.
    body = {"prompt": "Hi", "n_predict": 4, "grammar": 'root ::= "a" [\\x00]', "stream": True}
    reply = httpx.post(url + "/completion", json=body, timeout=60)
    running.join()
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert chunks[0]["content"] == "a" and "error" in chunks[-1]
    assert len(outs[0]) == 64  # the stream beside it went on to its end


def test_a_prompt_only_request_is_counted_in_the_metrics(url: str) -> None:
    before = metrics(url)
    res = complete(url, "A prompt to cache and nothing more", n=0, cache_prompt=False)
    after = metrics(url)
    assert res["tokens_predicted"] == 0
    n = res["timings"]["prompt_n"]
    assert n > 0
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == n


REWRITE = (
    "<start_of_turn>user\nRewrite the following text exactly:\n\n{}<end_of_turn>\n"
    "<start_of_turn>model\n"
)
TEXTS = [
    "The old lighthouse stood on the rocky point for more than a century. Its keeper climbed "
    "the spiral stairs every evening to light the lamp.",
    "Ships passing in the night relied on its steady beam to avoid the dangerous reef below, "
    "and in winter the storms were fierce.",
    "The market opens at dawn. Farmers bring apples, pears and fresh bread from the valley, "
    "and the square fills with voices.",
    "Every spring the river floods the low fields, and the children of the village build "
    "small boats from bark and leaves.",
]


def test_slots_speculate_each_reply_and_count_the_drafts(model_path: Path) -> None:
    """With -np 4 and n-gram speculation every slot drafts from its own reply: 4 rewrites at
    once each follow their alone text, report draft_n, and /metrics and /slots show it."""
    from localfab.engine.types import SpecSettings

    # Not adaptive: every reply drafts whatever the lookup finds (adaptivity has its own tests).
    spec = SpecSettings(spec_type="ngram-simple", adaptive=False)
    loaded, server = _serve(model_path, speculative=spec)
    try:
        url = server.url
        prompts = [REWRITE.format(t) for t in TEXTS]
        alone = [complete(url, p, n=48, cache_prompt=False, n_probs=2) for p in prompts]
        results: list[dict[str, Any]] = [{} for _ in prompts]

        def go(i: int) -> None:
            results[i] = complete(url, prompts[i], n=48, cache_prompt=False)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        drafted = accepted = 0
        for one, together in zip(alone, results, strict=True):
            assert_follows(one, together["content"])
            # Each reply copies its prompt: every slot drafted, and most drafts were kept.
            assert one["timings"]["draft_n_accepted"] > 0
            t = together["timings"]
            assert t["draft_n_accepted"] > 0.5 * t["draft_n"] > 0
            drafted += t["draft_n"]
            accepted += t["draft_n_accepted"]
        m = metrics(url)
        assert m["spec_decode_num_draft_tokens_total"] >= drafted > 0
        assert m["spec_decode_num_accepted_tokens_total"] >= accepted
        assert m["spec_decode_num_drafts_total"] > 0
        assert all(s["speculative"] for s in slots(url))
    finally:
        server.stop()
        loaded.close()
