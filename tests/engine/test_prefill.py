"""A cancel (a client that hung up) stops a long prompt within one micro-batch.

The prompt is fed one micro-batch (`n_ubatch`, 512) at a time, as llama.cpp computes it anyway;
before, a prompt shorter than `n_batch` (2048) was one call that ran to its end, so a client that
hung up during a long prefill held the engine (`-np 1`) until the whole prompt was processed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.engine.types import Done, GenerationOptions, SamplingParams

N_UBATCH = 512


class SetOnCheck(threading.Event):
    """An Event that sets itself when it is asked for the `n`-th time: a cancel that arrives
    while the prompt is being processed, at a point independent of the machine's speed."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.asked = 0
        self.n = n

    def is_set(self) -> bool:
        self.asked += 1
        if self.asked >= self.n:
            self.set()
        return super().is_set()


@pytest.fixture(scope="module")
def big_batch_engine(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    eng = Engine(model_path, EngineSettings(n_ctx=4096, n_batch=2048, n_ubatch=N_UBATCH))
    yield eng
    eng.close()


def long_prompt(engine: Any, n: int) -> list[int]:
    text = " ".join(f"item {i} is a small grey stone;" for i in range(n))
    return list(engine.tokenize(text)[:n])


def test_a_cancel_during_the_prompt_stops_it_after_one_micro_batch(big_batch_engine: Any) -> None:
    engine = big_batch_engine
    prompt = long_prompt(engine, 1900)
    assert len(prompt) == 1900
    cancel = SetOnCheck(2)  # set when asked after the first micro-batch
    opts = GenerationOptions(max_tokens=8, sampling=SamplingParams(temperature=0), cancel=cancel)
    events = list(engine.stream(prompt, opts))
    done = events[-1]
    assert isinstance(done, Done) and done.stop_type == "cancel"
    assert len(engine.cached_tokens) == N_UBATCH  # not the whole prompt
    # The next request takes what was processed and goes on from there.
    events = list(engine.stream(prompt, GenerationOptions(max_tokens=4, sampling=opts.sampling)))
    done = events[-1]
    assert isinstance(done, Done) and done.timings.cache_n == N_UBATCH


@pytest.mark.slow
def test_a_client_that_hangs_up_during_the_prompt_frees_the_engine(model_path: Path) -> None:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model
    from localfab.server import ServerSettings, create_app
    from localfab.server.runner import BackgroundServer
    from tests.server.test_slots import _wait_ready

    loaded = load_model(model_path, EngineSettings(n_ctx=4096, n_batch=2048, n_ubatch=N_UBATCH))
    server = BackgroundServer(create_app(loaded, ServerSettings())).start()
    try:
        _wait_ready(server.url)
        tokens = long_prompt(loaded.engine, 2000)
        body = {"prompt": tokens, "n_predict": 4, "stream": True, "return_progress": True}
        with httpx.stream("POST", server.url + "/completion", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if "prompt_progress" in line:
                    break  # the prompt is being processed: hang up
        res = httpx.post(
            server.url + "/completion", json={"prompt": tokens, "n_predict": 1}, timeout=120
        ).json()
        # The engine stopped the first prompt at a micro-batch boundary: this one found only
        # that much (none, when the hang-up was seen before the first micro-batch began, which
        # a loaded machine can make happen; the old code evaluated the whole prompt anyway).
        cached = res["timings"]["cache_n"]
        assert cached % N_UBATCH == 0 and cached < len(tokens) - 1, cached
    finally:
        server.stop()
        loaded.close()
