"""A thinking model's reply on the server: reasoning in `reasoning_content` (and streamed as
`delta.reasoning_content`) for each `reasoning_format`, thinking turned off through the template.

The test model does not think: it runs with a real thinking template (Qwen3's, DeepSeek-R1
distill's) and a grammar makes it write a block and an answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.chat.prompt import PromptBuilder
from localfab.chat.templates import ChatTemplate
from localfab.server import ServerSettings
from tests.serverproc import serve_in_process

TEMPLATES = Path(__file__).resolve().parents[1] / "engine" / "templates"
FORCED = 'root ::= "<think>\\nPlan it step by step.\\n</think>\\n\\nDone."'
USER = [{"role": "user", "content": "Hi"}]


def serve(model_path: Path, template: str, **settings: Any) -> Iterator[str]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    source = (TEMPLATES / template).read_text(encoding="utf-8")
    loaded.prompts = PromptBuilder(loaded.engine, ChatTemplate(source, "gguf"))
    yield from serve_in_process(loaded, ServerSettings(**settings))


@pytest.fixture(scope="module")
def qwen3(model_path: Path) -> Iterator[str]:
    yield from serve(model_path, "Qwen-Qwen3-0.6B.jinja")


def chat(url: str, **extra: Any) -> dict[str, Any]:
    body = {"messages": USER, "max_tokens": 40, "temperature": 0, "grammar": FORCED, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def streamed(url: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"messages": USER, "max_tokens": 40, "temperature": 0, "grammar": FORCED}
    deltas = []
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, **extra, "stream": True}, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                deltas += [c["delta"] for c in chunk["choices"]]
    return deltas


def joined(deltas: list[dict[str, Any]], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


def test_the_reasoning_is_apart_from_the_answer_whole_and_streamed(qwen3: str) -> None:
    # As llama-server: the newline before </think> stays in the reasoning.
    message = chat(qwen3)["choices"][0]["message"]
    assert message["reasoning_content"] == "Plan it step by step.\n"
    assert message["content"] == "Done."
    deltas = streamed(qwen3)
    assert joined(deltas, "reasoning_content") == "Plan it step by step.\n"
    assert joined(deltas, "content") == "Done."
    # The thought comes first, the answer after it.
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")


def test_reasoning_format_none_and_legacy(qwen3: str) -> None:
    raw = "<think>\nPlan it step by step.\n</think>\n\nDone."
    message = chat(qwen3, reasoning_format="none")["choices"][0]["message"]
    assert message == {"role": "assistant", "content": raw}
    legacy = chat(qwen3, reasoning_format="deepseek-legacy")["choices"][0]["message"]
    assert legacy["reasoning_content"] == "Plan it step by step.\n"
    # llama-server of this llama.cpp streams deepseek-legacy apart too (not inline).
    deltas = streamed(qwen3, reasoning_format="deepseek-legacy")
    assert joined(deltas, "reasoning_content") == "Plan it step by step.\n"
    assert joined(deltas, "content") == "Done."
    assert joined(streamed(qwen3, reasoning_format="none"), "content") == raw
    r = httpx.post(
        qwen3 + "/v1/chat/completions",
        json={"messages": USER, "reasoning_format": "bogus"},
        timeout=60,
    )
    assert r.status_code == 400


def test_thinking_off_closes_the_block_in_the_prompt(qwen3: str) -> None:
    def prompt(**extra: Any) -> str:
        r = httpx.post(qwen3 + "/apply-template", json={"messages": USER, **extra}, timeout=60)
        return str(r.json()["prompt"])

    assert prompt().endswith("<|im_start|>assistant\n")
    off = prompt(chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_template_that_opens_the_block_starts_the_reply_inside_it(model_path: Path) -> None:
    forced = 'root ::= "Plan it.\\n</think>\\n\\nDone."'
    for url in serve(model_path, "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"):
        message = chat(url, grammar=forced)["choices"][0]["message"]
        # As llama-server: the prompt's newline after <think> begins the reasoning.
        assert (message["reasoning_content"], message["content"]) == ("\nPlan it.\n", "\n\nDone.")


def test_reasoning_off_for_the_whole_server(model_path: Path) -> None:
    for url in serve(model_path, "Qwen-Qwen3-0.6B.jinja", reasoning="off"):
        r = httpx.post(url + "/apply-template", json={"messages": USER}, timeout=60)
        assert r.json()["prompt"].endswith("<think>\n\n</think>\n\n")


def test_a_reasoning_budget_closes_the_block_and_an_answer_follows(model_path: Path) -> None:
    """--reasoning-budget 32 on two slots (the batched token step), and a request's own
    `reasoning_budget_tokens` and `reasoning_budget_message`, streamed and whole."""
    r1 = "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
    for url in serve(model_path, r1, reasoning_budget=32, n_parallel=2):

        def tokens(reasoning: str, url: str = url) -> int:
            """The generated tokens of a reasoning (it starts with the prompt's newline)."""
            text = reasoning.removeprefix("\n")
            r = httpx.post(url + "/tokenize", json={"content": text}, timeout=60)
            return len(r.json()["tokens"])

        free = {"max_tokens": 60, "ignore_eos": True, "grammar": None}
        # Unbounded, the test model thinks past 32 tokens (it does not close the block itself).
        unbounded = chat(url, reasoning_budget_tokens=-2, **free)["choices"][0]["message"]
        assert tokens(unbounded["reasoning_content"]) > 40 and not unbounded["content"]
        message = chat(url, **free)["choices"][0]["message"]
        assert 0 < tokens(message["reasoning_content"]) <= 32 and message["content"]
        said = {"reasoning_budget_tokens": 8, "reasoning_budget_message": " Time to answer."}
        short = chat(url, **free, **said)["choices"][0]["message"]
        assert short["reasoning_content"].endswith(" Time to answer.")
        assert tokens(short["reasoning_content"]) <= 8 + tokens(" Time to answer.") + 1
        deltas = streamed(url, **free, **said)
        assert joined(deltas, "reasoning_content") == short["reasoning_content"]
        assert joined(deltas, "content") == short["content"]
        props = httpx.get(url + "/props", timeout=60).json()["chat_template_caps"]
        assert props["supports_thinking"] and not props["supports_enable_thinking"]
        assert not props["supports_preserve_reasoning"]
