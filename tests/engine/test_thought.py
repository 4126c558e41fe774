"""A thinking model's reply in the token step: the split into reasoning and answer as tokens come,
and the reasoning budget that closes the block (llama-server's --reasoning-budget)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.engine import Done, GenerationOptions, SamplingParams, TokenEvent
from localfab.engine.reasoning import Thinking
from localfab.engine.thought import ThoughtStep
from tests.engine.test_spec import NGRAM, REWRITE

QWEN3 = Thinking("<think>", "</think>", toggle=True, start_gap="\n", end_gap="\n\n")
OPENED = Thinking("<think>", "</think>", opened_by_prompt=True)
CLOSE = [7, 8]  # the forced tokens in the unit tests: stand-ins for "</think>"


def take_all(step: ThoughtStep, pieces: list[str]) -> tuple[list[tuple[str, str]], list[int]]:
    """Feed text pieces as tokens; the parts and, per piece, how many forced tokens followed."""
    parts: list[tuple[str, str]] = []
    forced_after: list[int] = []
    for piece in pieces:
        parts += step.take(piece, whole=True)
        n = 0
        while step.forced() is not None:
            n += 1
        forced_after.append(n)
    return parts, forced_after


def test_the_budget_forces_the_close_after_that_many_tokens_in_the_block() -> None:
    step = ThoughtStep(QWEN3, budget=3, forced=CLOSE)
    pieces = ["<think>", "\n", "one", " two", " three", " four"]
    parts, forced_after = take_all(step, pieces)
    # The opening tag does not count; its gap does, and the second word fills the budget.
    assert forced_after == [0, 0, 0, 2, 0, 0]
    assert step.budget_hit and step.n_block == 3  # the forced tokens do not count
    assert "".join(t for k, t in parts if k == "reasoning") == "one two three four"


def test_a_block_opened_again_gets_a_budget_of_its_own_as_in_llama_server() -> None:
    step = ThoughtStep(QWEN3, budget=2, forced=CLOSE)
    pieces = ["<think>", "a", "b", "</", "think>", "x", "<think>", "c", "d", "e"]
    # "</" "think>" stand for the forced tokens' text; the second block is answer text to the
    # split (one block per reply), but its budget runs out alike.
    assert take_all(step, pieces)[1] == [0, 0, 2, 0, 0, 0, 0, 0, 2, 0]


def test_the_prompt_tokens_after_an_opened_tag_count_against_the_budget() -> None:
    # As llama-server: R1's prompt ends "<think>\n"; that newline is the block's first token.
    step = ThoughtStep(OPENED, budget=3, forced=CLOSE, n_tail=1)
    assert take_all(step, ["a", "b", "c"])[1] == [0, 2, 0]
    step = ThoughtStep(OPENED, budget=1, forced=CLOSE, n_tail=1)
    assert step.forced() == 7  # spent by the prompt: forced from the first token on


def test_a_zero_budget_closes_the_block_as_it_opens_and_minus_one_never() -> None:
    step = ThoughtStep(QWEN3, budget=0, forced=CLOSE)
    assert take_all(step, ["<think>"])[1] == [2]
    step = ThoughtStep(OPENED, budget=0, forced=CLOSE)  # the prompt opened it: at once
    assert take_all(step, ["a"])[1] == [2]
    step = ThoughtStep(QWEN3, budget=-1, forced=CLOSE)
    assert take_all(step, ["<think>", *["x"] * 50])[1] == [0] * 51
    assert not step.budget_hit and step.n_reasoning == 51


def test_the_budget_waits_for_a_whole_character_and_not_for_an_answer() -> None:
    step = ThoughtStep(OPENED, budget=2, forced=CLOSE)
    step.take("a", whole=True)
    assert step.forced() is None
    step.take("", whole=False)  # the first bytes of a character: the budget is spent
    assert step.forced() is None
    step.take("é", whole=True)
    assert step.forced() == 7 and step.forced() == 8 and step.forced() is None
    # A block the model closed itself is never forced, however long the answer.
    step = ThoughtStep(QWEN3, budget=3, forced=CLOSE)
    assert take_all(step, ["<think>", "\n", "x", "</think>", *["y"] * 9])[1] == [0] * 13
    assert step.split.content == "y" * 9


# --- on the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eng(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    engine = Engine(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    yield engine
    engine.close()


def streamed(engine: Any, prompt: list[int], opts: GenerationOptions) -> tuple[str, str, Done]:
    """The reasoning and the answer as the events carried them, and the Done."""
    got = {"reasoning": "", "content": ""}
    done = None
    for event in engine.stream(prompt, opts):
        if isinstance(event, TokenEvent):
            for kind, text in event.parts or ():
                got[kind] += text
        else:
            done = event
    assert done is not None
    return got["reasoning"], got["content"], done


FORCED = SamplingParams(temperature=0, ignore_eos=True)


def test_a_budget_of_32_closes_the_block_and_an_answer_follows(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE + "<think>\n")
    opts = GenerationOptions(max_tokens=60, sampling=FORCED, thinking=OPENED, reasoning_budget=32)
    eng.clear_cache()
    reasoning, content, done = streamed(eng, prompt, opts)
    assert done.budget_hit
    close = tuple(eng.tokenize("</think>", add_special=False))
    at = [i for i in range(len(done.tokens)) if done.tokens[i : i + len(close)] == close]
    # 32 tokens of thought, then the closing tag, forced; the rest is the answer.
    assert at == [32]
    assert done.reasoning_tokens == 32 + len(close)
    assert done.text.index("</think>") == len(eng.detokenize(done.tokens[:32]))
    assert (reasoning, content) == (done.reasoning, done.content)
    assert done.reasoning == done.text[: done.text.index("</think>")].lstrip()
    assert content and done.content == done.answer and done.text.endswith(done.content)
    # With a message, it comes before the tag, in the reasoning.
    eng.clear_cache()
    said = GenerationOptions(
        max_tokens=60,
        sampling=FORCED,
        thinking=OPENED,
        reasoning_budget=8,
        reasoning_budget_message=" Enough thinking.",
    )
    _, _, done = streamed(eng, prompt, said)
    assert done.reasoning is not None and done.reasoning.endswith(" Enough thinking.")
    assert done.content


def test_the_split_is_the_same_with_speculative_decoding(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE + "<think>\n")
    opts = GenerationOptions(max_tokens=80, sampling=FORCED, thinking=OPENED, reasoning_budget=40)
    eng.clear_cache()
    plain = streamed(eng, prompt, opts)
    eng.set_speculation(NGRAM)
    try:
        eng.clear_cache()
        fast = streamed(eng, prompt, opts)
    finally:
        eng.set_speculation(None)
    assert fast[2].tokens == plain[2].tokens and fast[:2] == plain[:2]
    assert fast[2].timings.draft_n_accepted > 0 and fast[2].budget_hit


def test_without_thinking_the_events_carry_no_parts(eng: Any) -> None:
    prompt = eng.tokenize("Once upon a time")
    events = list(eng.stream(prompt, GenerationOptions(max_tokens=8, sampling=FORCED)))
    done = events[-1]
    assert isinstance(done, Done) and done.reasoning is None and done.answer == done.text
    assert all(e.parts is None for e in events if isinstance(e, TokenEvent))
