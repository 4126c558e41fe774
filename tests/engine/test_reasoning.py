"""Thinking models: the tags real chat templates think in, and the split of a reply into
reasoning and answer, byte-exact for every chunking of it (llama.cpp's expected parses)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from localfab.chat.templates import ChatTemplate
from localfab.chat.thinking import template_thinking
from localfab.engine.reasoning import ReasoningSplit, Thinking, Unsplit

TEMPLATES = Path(__file__).parent / "templates"


def thinking_of_file(name: str) -> Thinking | None:
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    template = ChatTemplate(source, "gguf", bos_token="<s>", eos_token="</s>")
    return template_thinking(template, template.render([{"role": "user", "content": "Hi"}]))


# What the probe finds in real templates: Qwen3 writes "<think>\n" and "</think>\n\n" around a
# reply's reasoning; DeepSeek-R1's distills open the block in the prompt ("<think>\n").
QWEN3 = Thinking("<think>", "</think>", toggle=True, start_gap="\n", end_gap="\n\n")
R1 = Thinking("<think>", "</think>", opened_by_prompt=True, prompt_tail="\n")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Qwen-Qwen3-0.6B.jinja", QWEN3),
        ("Qwen-QwQ-32B.jinja", replace(R1, toggle=True)),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", replace(R1, toggle=True)),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1),
        ("HuggingFaceTB-SmolLM3-3B.jinja", replace(QWEN3, start_gap="", end_gap="")),
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", Thinking("[THINK]", "[/THINK]")),
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
            Thinking("<|START_THINKING|>", "<|END_THINKING|>", toggle=True),
        ),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", None),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
    ],
)
def test_the_thinking_of_real_templates(name: str, expected: Thinking | None) -> None:
    assert thinking_of_file(name) == expected


# Replies (forced with a grammar) and the (reasoning_content, content) that llama-server of the
# same llama.cpp returned for them, with Qwen3's and DeepSeek-R1-Distill-Llama's templates, for
# every reasoning_format but none, streamed and whole alike; and llama.cpp's test-chat cases.
CASES = [
    (QWEN3, "<think>\nPlan it.\n</think>\n\nDone.", "Plan it.\n", "Done."),
    (QWEN3, "<think>\nStill thinking \n", "Still thinking \n", ""),  # never closed
    (QWEN3, "Done.", "", "Done."),
    (QWEN3, "<think>  a  b  </think>  c  ", "  a  b  ", "  c  "),
    (QWEN3, "<think>\n \nx</think>\n \ny", " \nx", " \ny"),
    (QWEN3, "<think>\n\n\nx\n\n</think>\n\n\ny", "\n\nx\n\n", "\ny"),
    (QWEN3, "\n<think>x</think>y", "x", "y"),
    (QWEN3, "<think>\tx</think>\ty", "\tx", "\ty"),
    (QWEN3, "<think>\n\n</think>\n\nHello", "", "Hello"),  # thinking off: an empty block
    (QWEN3, "\n\nDone.", "", "Done."),
    (QWEN3, "  Done.", "", "Done."),
    (QWEN3, "<think>I'm\nthinking</think>Hello, world!\nWhat's up?", "I'm\nthinking",
     "Hello, world!\nWhat's up?"),
    (R1, "\nPlan.\n</think>\n\nDone.", "\n\nPlan.\n", "\n\nDone."),
    (R1, "Plan.</think>  Done.", "\nPlan.", "  Done."),
    (R1, "  Plan.", "\n  Plan.", ""),
    (R1, "</think>Hello, world!", "", "Hello, world!"),
    (R1, "thinking about </thi", "\nthinking about </thi", ""),  # cut inside the closing tag
    (QWEN3, "<thi", "", "<thi"),  # a reply that only looks like the opening tag
    (QWEN3, "a < b and </think> stays", "", "a < b and </think> stays"),  # no block: as is
    (Thinking("[THINK]", "[/THINK]"), "[THINK]Plan.[/THINK]Answer.", "Plan.", "Answer."),
]  # fmt: skip


@pytest.mark.parametrize(("thinking", "reply", "reasoning", "content"), CASES)
def test_a_reply_splits_the_same_for_every_chunking(
    thinking: Thinking, reply: str, reasoning: str, content: str
) -> None:
    assert whole(reply, thinking) == (reasoning, content)
    chunkings = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)]
    chunkings.append(list(reply))  # a character at a time
    rng = random.Random(len(reply))
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(reply) + 1), min(4, len(reply) + 1)))
        chunkings.append([reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)])
    for chunks in chunkings:
        split = ReasoningSplit(thinking)
        pieces = [p for chunk in chunks for p in split.feed(chunk)] + split.finish()
        got = (
            "".join(t for k, t in pieces if k == "reasoning"),
            "".join(t for k, t in pieces if k == "content"),
        )
        assert got == (reasoning, content), chunks
        # The reasoning comes first: no reasoning piece after the first piece of the answer.
        kinds = [k for k, _ in pieces]
        assert "reasoning" not in kinds[kinds.index("content") :] if "content" in kinds else True


def test_thinking_off_closes_the_block_in_the_prompt_where_the_template_takes_it() -> None:
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(source, "gguf")
    user = [{"role": "user", "content": "Hi"}]
    assert template.render(user).endswith("<|im_start|>assistant\n")
    off = template.render(user, variables={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # An earlier turn's reasoning is dropped from the history, as the template wants.
    turns = [*user, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"}]
    again = template.render([*turns, {"role": "user", "content": "And?"}])
    assert "hmm" not in again and "Hello" in again


def test_the_block_streams_as_it_comes_and_holds_back_only_a_possible_tag() -> None:
    split = ReasoningSplit(QWEN3)
    assert split.feed("<think>\nStep one") == [("reasoning", "Step one")]
    assert split.feed(", step two </th") == [("reasoning", ", step two ")]
    assert split.feed("ink>\n\nThe answer") == [("content", "The answer")]
    assert split.finish() == []


def test_a_reply_left_whole_is_what_llama_server_leaves() -> None:
    # reasoning_format none: llama-server's content starts with the block the prompt opened and
    # drops the reply's leading whitespace; a chunking changes nothing.
    for thinking, reply, content in [
        (QWEN3, "\n<think>x</think>y", "<think>x</think>y"),
        (R1, "\nPlan.\n</think>\n\nDone.", "<think>\n\nPlan.\n</think>\n\nDone."),
        (R1, "  Plan.", "<think>\n  Plan."),
    ]:
        assert Unsplit(thinking).feed(reply) == content
        whole = Unsplit(thinking)
        assert "".join(whole.feed(c) for c in reply) == content


def whole(text: str, thinking: Thinking) -> tuple[str, str]:
    """A whole reply split at once: (reasoning, content)."""
    split = ReasoningSplit(thinking)
    split.feed(text)
    split.finish()
    return split.reasoning, split.content
