"""The generation stream on the real test model: options, stop kinds, a full window's shift."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from localfab.engine import Done, Engine, GenerationOptions, SamplingParams, StopType
from localfab.engine.types import FinishReason

GREEDY = SamplingParams.greedy()
ROOT = Path(__file__).resolve().parents[2]


def test_generation_options_keep_stop_strings_immutable() -> None:
    stops = ["\n\n", "END"]
    opts = GenerationOptions(stop=stops)
    stops.append("later")
    assert opts.stop == ("\n\n", "END")
    assert opts.sampling == SamplingParams() and opts.max_tokens == -1


@pytest.mark.model
def test_options_object_and_keywords_give_the_same_reply(engine: Engine) -> None:
    tokens = engine.tokenize("The history of the city of Rome begins")
    engine.clear_cache()  # both from an empty cache (see test_engine.test_seeded_sampling_repeats)
    by_keywords = engine.generate(tokens, max_tokens=12, sampling=GREEDY)
    engine.clear_cache()
    by_options = engine.generate(tokens, GenerationOptions(max_tokens=12, sampling=GREEDY))
    assert by_options.tokens == by_keywords.tokens and len(by_options.tokens) == 12
    assert by_options.text == by_keywords.text
    with pytest.raises(TypeError, match="not both"):
        engine.generate(tokens, GenerationOptions(max_tokens=4), max_tokens=8)
    # A refused call leaves the engine free for the next one.
    assert engine.generate(tokens, GenerationOptions(max_tokens=2)).finish_reason == "length"


def _stop_kinds(engine: Engine, small_engine: Engine) -> dict[str, Done]:
    """One real generation ending each way the engine can end one."""
    tokens = engine.tokenize("Once upon a time")
    eos = engine.eos_token
    forced_eos = SamplingParams(temperature=0, logit_bias=((eos, 1e4),))
    plain = engine.generate(tokens, max_tokens=30, sampling=GREEDY)
    word = plain.text.strip().split()[2]
    cancel = threading.Event()
    cancel.set()
    small_prompt = small_engine.tokenize("Once upon a time")
    return {
        "limit": plain,
        "eos": engine.generate(tokens, max_tokens=8, sampling=forced_eos),
        "word": engine.generate(tokens, max_tokens=30, sampling=GREEDY, stop=[word]),
        "cancel": engine.generate(tokens, max_tokens=8, sampling=GREEDY, cancel=cancel),
        "context": small_engine.generate(
            small_prompt, sampling=SamplingParams(temperature=0, ignore_eos=True)
        ),
    }


@pytest.fixture()
def small_engine(model_path: Path) -> Iterator[Engine]:
    from localfab.engine import EngineSettings

    eng = Engine(model_path, EngineSettings(n_ctx=256, n_batch=256, warmup=False))
    yield eng
    eng.close()


@pytest.mark.model
def test_every_way_a_reply_ends_is_a_declared_stop_type(
    engine: Engine, small_engine: Engine
) -> None:
    dones = _stop_kinds(engine, small_engine)
    for kind, done in dones.items():
        assert done.stop_type == kind
        assert done.stop_type in get_args(StopType)
        assert done.finish_reason in get_args(FinishReason)
    assert dones["eos"].tokens == () and dones["eos"].finish_reason == "stop"
    assert dones["eos"].completion_tokens == 1  # the end-of-generation token counts
    assert dones["word"].stopping_word and dones["word"].finish_reason == "stop"
    assert dones["cancel"].finish_reason == "cancelled"
    assert dones["context"].finish_reason == "length"
    # Without on_context_full the reply ends once the window is full.
    n_prompt = dones["context"].prompt_tokens
    assert n_prompt + len(dones["context"].tokens) == small_engine.n_ctx + 1


@pytest.mark.model
def test_a_full_window_shifts_to_what_on_context_full_returns(small_engine: Engine) -> None:
    prompt = small_engine.tokenize("Once upon a time")
    calls: list[tuple[int, list[int]]] = []

    def make_room(generated: list[int]) -> list[int]:
        # Keep the prompt's first tokens and the recent reply; the newest token, not yet
        # evaluated, is left out: the engine evaluates it after the shift.
        target = prompt[:2] + generated[-200:-1]
        calls.append((len(generated), target))
        return target

    n_ctx = small_engine.n_ctx  # llama.cpp rounds the context up (to 256 here)
    n_gen = n_ctx + 120
    done = small_engine.generate(
        prompt,
        max_tokens=n_gen,
        sampling=SamplingParams(temperature=0, ignore_eos=True),
        on_context_full=make_room,
    )
    assert len(done.tokens) == n_gen and done.stop_type == "limit"
    # It went on past the window, shifting each time the window filled again.
    assert len(calls) >= 2 and all(len(t) == 201 for _, t in calls)
    # The cache holds the last target, then every token generated after it but the last.
    n_at_shift, target = calls[-1]
    expected = target + list(done.tokens[n_at_shift - 1 : -1])
    assert small_engine.cached_tokens == expected
    assert len(expected) <= n_ctx
