"""`--context-shift`: a reply shifts as many times as it needs, on one slot and on parallel
slots, with and without speculation.

Each shift works on what the cache holds then; halving the whole history instead asked, past
twice the context, for a window that never fits, and the reply ended there (at 1,015 of 1,500
tokens with 512 per slot).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from localfab.server.chat_window import ChatWindow
from localfab.server.reply_shift import ReplyShift

PROMPT = "Repeat forever: red green blue yellow."
N_SLOT = 128  # tokens per slot
N_PREDICT = 600  # more than four windows


def _simulate(shift: ReplyShift, prompt: list[int], n_ctx: int, n: int) -> list[list[int]]:
    """Drive `shift` as the engine does (the cache holds all but the reply's last token when it
    fills) for `n` tokens; returns the cache at each shift. Fails if the reply would stop."""
    cache = list(prompt)
    generated: list[int] = []
    caches = []
    for tok in range(1000, 1000 + n):
        generated.append(tok)
        if len(cache) >= n_ctx:
            target = shift(generated)
            assert target is not None, f"stopped at {len(generated)} of {n}"
            assert len(target) < n_ctx
            # The target is the cache with one run of tokens cut out: its head and its newest
            # tokens, in order (so the engine moves cells and evaluates nothing).
            assert any(
                target == cache[:k] + cache[len(cache) - (len(target) - k) :]
                for k in range(1, len(target))
            )
            caches.append(list(cache))
            cache = list(target)
        cache.append(tok)
    return caches


def test_a_reply_shifts_what_is_cached_any_number_of_times() -> None:
    prompt = list(range(1, 41))
    caches = _simulate(ReplyShift(prompt, 0, None), prompt, 128, 1000)
    assert len(caches) > 10
    # Each shift halves what followed BOS (n_keep 0): the window fills again after ~half of it.
    assert all(len(c) == 128 for c in caches)


def test_n_keep_minus_one_keeps_the_whole_prompt_at_every_shift() -> None:
    prompt = list(range(1, 41))
    shift = ReplyShift(prompt, -1, None)
    cache = list(prompt)
    generated: list[int] = []
    for tok in range(1000, 1600):
        generated.append(tok)
        if len(cache) >= 128:
            target = shift(generated)
            assert target is not None and target[:41] == cache[:41]
            cache = target
        cache.append(tok)


def test_a_chat_gives_up_whole_turns_first_then_halves_the_cache() -> None:
    def prompt(messages: Any) -> list[int]:
        out: list[int] = [1]
        for m in messages:
            out += [2] + [ord(c) for c in m["content"]] + [3]
        return out

    messages = [
        {"role": "system", "content": "s" * 10},
        {"role": "user", "content": "a" * 30},
        {"role": "assistant", "content": "b" * 30},
        {"role": "user", "content": "c" * 10},
    ]
    window = ChatWindow(messages, prompt, 128)
    shift = ReplyShift(window.tokens, 0, window)
    caches = _simulate(shift, window.tokens, 128, 800)
    assert window.left_out["turns"] >= 1  # the first shift let the oldest turn go
    assert len(caches) > 5


def _serve(model_path: Any, n_parallel: int, spec: bool) -> tuple[Any, Any]:
    from localfab.engine import EngineSettings
    from localfab.engine.types import SpecSettings
    from localfab.runtime import load_model
    from localfab.server import ServerSettings, create_app
    from localfab.server.runner import BackgroundServer
    from tests.server.test_slots import _wait_ready

    loaded = load_model(
        model_path,
        EngineSettings(n_ctx=N_SLOT * n_parallel, n_batch=256, n_seq_max=n_parallel),
        speculative=SpecSettings(spec_type="ngram-simple") if spec else None,
    )
    settings = ServerSettings(n_parallel=n_parallel, context_shift=True)
    server = BackgroundServer(create_app(loaded, settings)).start()
    _wait_ready(server.url)
    return loaded, server


@pytest.mark.slow
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "ngram-simple"])
@pytest.mark.parametrize("n_parallel", [1, 4])
def test_a_shifting_reply_runs_to_its_n_predict(
    model_path: Any, n_parallel: int, spec: bool
) -> None:
    loaded, server = _serve(model_path, n_parallel, spec)
    try:
        body = {"prompt": PROMPT, "n_predict": N_PREDICT, "ignore_eos": True, "temperature": 0}
        n_clients = 2 if n_parallel > 1 else 1
        outs: list[dict[str, Any]] = [{} for _ in range(n_clients)]

        def go(i: int) -> None:
            r = httpx.post(server.url + "/completion", json=body, timeout=600)
            outs[i] = r.json()

        threads = [threading.Thread(target=go, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for out in outs:
            assert out["tokens_predicted"] == N_PREDICT, out.get("stop_type")
            assert out["stop_type"] == "limit"
            assert out["truncated"] is True  # as llama-server says of a reply that shifted
        if n_parallel == 1 and not spec:  # a chat with no turn to give halves as often
            chat = {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": N_PREDICT,
                "ignore_eos": True,
                "temperature": 0,
            }
            res = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=600).json()
            assert res["usage"]["completion_tokens"] == N_PREDICT
            assert res["choices"][0]["finish_reason"] == "length"
    finally:
        server.stop()
        loaded.close()
