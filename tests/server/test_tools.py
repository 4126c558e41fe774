"""Tool calling on the server, with the official openai client over real sockets.

The test model cannot decide to call a tool; `tool_choice: required` (or a named tool) and the
grammar make it call one, which exercises everything but the model's judgement: the tools in
the prompt, the grammar, the parse, the stream, the ids, the tool message that comes back."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from localfab.chat.prompt import PromptBuilder
from localfab.chat.templates import ChatTemplate
from localfab.server import ServerSettings
from tests.engine.test_toolcalls import WEATHER
from tests.serverproc import serve, serve_in_process

TEMPLATES = Path(__file__).resolve().parents[1] / "engine" / "templates"
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


def streamed_calls(stream: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """Content, calls and finish reason put back together from a stream, as clients do."""
    content, calls, finish = "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for piece in delta.tool_calls or ():
            if piece.index == len(calls):
                assert piece.id and piece.type == "function" and piece.function.name
                calls.append({"id": piece.id, "name": "", "arguments": ""})
            call = calls[piece.index]
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def tool_loop(
    client: OpenAI, id_chars: int = 32, tool: dict[str, Any] = WEATHER
) -> list[dict[str, Any]]:
    """Request with tools -> a call (whole and streamed alike) -> the tool's result -> an
    answer; the conversation."""
    ask = {"model": "m", "tools": [tool], "tool_choice": "required", "temperature": 0}
    whole = client.chat.completions.create(
        messages=QUESTION, parallel_tool_calls=False, max_tokens=60, **ask
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == ""
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and len(call.id) == id_chars
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    stream = client.chat.completions.create(
        messages=QUESTION, parallel_tool_calls=False, max_tokens=60, stream=True, **ask
    )
    content, calls, finish = streamed_calls(stream)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (call.function.name, call.function.arguments)
    ]
    history = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'},
    ]
    answer = client.chat.completions.create(
        model="m",
        messages=history,
        tools=[tool],
        tool_choice="none",
        max_tokens=16,
        temperature=0,
    )
    final = answer.choices[0]
    assert final.message.tool_calls is None and final.message.content is not None
    assert final.finish_reason in ("stop", "length")
    return history


@pytest.mark.parametrize("slots", [1, 4])
def test_a_full_tool_loop_with_the_openai_client(model_path: Path, slots: int) -> None:
    """On `localfab serve` (the test model knows no tools: they are described to it and its
    calls come in `<tool_call>` JSON); with -np 4, four clients at once."""
    with serve(model_path, "-c", str(1024 * slots), "-np", str(slots)) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                history = tool_loop(client)
                answer = client.chat.completions.create(
                    model="m", messages=history, max_tokens=16, temperature=0
                )
                assert answer.choices[0].message.content  # the test model answers here
            except BaseException as exc:  # reported below, from the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=loop) for _ in range(slots)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors[0]
        props = httpx.get(server.url + "/props").json()
        assert props["chat_template_caps"]["supports_tool_calls"] is False


@pytest.fixture(scope="module")
def qwen(model_path: Path) -> Iterator[str]:
    """The test model with Qwen2.5's template, whose calls are `<tool_call>` JSON."""
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512, n_seq_max=2))
    source = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    loaded.prompts = PromptBuilder(loaded.engine, ChatTemplate(source, "gguf"))
    yield from serve_in_process(loaded, ServerSettings(n_parallel=2))


@pytest.mark.parametrize(
    ("name", "id_chars"),
    [
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 9),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", 9),
        ("meetkai-functionary-medium-v3.2.jinja", 32),
    ],
)
def test_a_tool_loop_on_templates_with_demands_of_their_own(
    model_path: Path, name: str, id_chars: int
) -> None:
    """Mistral's templates refuse a call id that is not nine letters and digits: the grammar
    has the model write one (Nemo's JSON `id`, Small 3.2's `[CALL_ID]`), so that the call comes
    back in the next request's history and renders. Functionary v3.2's prompt opens the call
    (`>>>`) and its template takes the arguments as text."""
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    # (Only the city: on these templates the test model writes the days as digits that go on.)
    city = {**WEATHER, "function": {**WEATHER["function"], "parameters": CITY_ONLY}}
    with serve_template(model_path, source) as url:
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        history = tool_loop(client, id_chars=id_chars, tool=city)
        shown = httpx.post(url + "/apply-template", json={"messages": history}).json()["prompt"]
        after = shown[shown.rindex(QUESTION[0]["content"]) :]  # the call and its result
        assert "get_weather" in after and history[-1]["content"] in after
        if id_chars == 9:  # these templates write the ids
            assert history[-1]["tool_call_id"] in after


CITY_ONLY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def serve_template(model_path: Path, source: str) -> Any:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512, n_seq_max=1))
    loaded.prompts = PromptBuilder(loaded.engine, ChatTemplate(source, "gguf", "<s>", "</s>"))
    return contextlib.contextmanager(lambda: serve_in_process(loaded, ServerSettings()))()


def post(url: str, **body: Any) -> httpx.Response:
    body = {"messages": QUESTION, "max_tokens": 60, "temperature": 0, **body}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_the_models_own_template_shows_the_tools_and_reads_its_calls(qwen: str) -> None:
    prompt = httpx.post(
        qwen + "/apply-template", json={"messages": QUESTION, "tools": [WEATHER]}
    ).json()["prompt"]
    assert "<tools>" in prompt and '"get_weather"' in prompt
    r = post(
        qwen, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["type"] == "function"
    # Two results (n=2) on the two slots, each with its call and its own ids.
    r = post(qwen, tools=[WEATHER], tool_choice="required", n=2, parallel_tool_calls=False)
    choices = r.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "tool_calls"]
    ids = {c["message"]["tool_calls"][0]["id"] for c in choices}
    assert len(ids) == 2
    props = httpx.get(qwen + "/props").json()
    assert props["chat_template_caps"]["supports_tool_calls"] is True


def test_a_stop_string_at_the_calls_end_keeps_the_call(qwen: str) -> None:
    """A stop string the call's end marker matches ends the reply there: the call is whole
    but for that marker, and is a call (as llama-server's lenient parse has it), whole and
    streamed; a stop string inside the arguments leaves the call as far as it went."""
    ask = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    r = post(qwen, stop=["</tool_call>"], **ask)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["city"]
    client = OpenAI(base_url=qwen + "/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=QUESTION,
        max_tokens=60,
        temperature=0,
        stop=["</tool_call>"],
        stream=True,
        **ask,
    )
    content, calls, finish = streamed_calls(stream)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("get_weather", call["function"]["arguments"])
    ]
    cut = post(qwen, stop=['"city"'], **ask).json()["choices"][0]
    assert cut["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert cut["message"]["tool_calls"][0]["function"]["arguments"].rstrip() == "{"


def test_requests_llama_server_refuses_are_refused_alike(qwen: str, model_path: Path) -> None:
    cases = [
        (
            {"tools": [WEATHER], "grammar": 'root ::= "x"'},
            400,
            "Cannot use custom grammar constraints with tools.",
        ),
        ({"tools": [WEATHER], "tool_choice": "always"}, 400, "Invalid tool_choice: always"),
        ({"tools": [{"type": "retrieval"}]}, 400, "Failed to parse tools"),
        ({"tools": [{"function": {"name": "f"}}]}, 400, "Missing tool type"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            400,
            "Invalid tool_choice",
        ),
        (
            {"tools": [WEATHER], "stream": True, "logprobs": True},
            400,
            "logprobs is not supported with tools + stream",
        ),
    ]
    for body, status, message in cases:
        r = post(qwen, **body)
        assert r.status_code == status, (body, r.text)
        assert message in r.json()["error"]["message"]
    # tool_choice none: the tools are shown, nothing is parsed or constrained.
    r = post(qwen, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"]
    with serve(model_path, "-c", "512", "--no-jinja") as server:
        r = post(server.url, tools=[WEATHER])
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "tools param requires --jinja flag"


def test_a_tool_whose_parameters_nest_60_deep(model_path: Path) -> None:
    """llama-server takes a tool schema nested 60 deep (it sets no depth of its own): so does
    this server, for the tool's arguments and for a reply format alike."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(60):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    deep = {"type": "function", "function": {"name": "deep", "parameters": schema}}
    source = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    with serve_template(model_path, source) as url:  # the tool's description takes 1300 tokens
        r = post(url, tools=[deep], tool_choice="required", max_tokens=24)
        assert r.status_code == 200, r.text
        # The grammar holds the call to its schema: the arguments open an object per level.
        shown = r.json()["choices"][0]["message"]
        written = shown.get("content") or "".join(
            c["function"]["arguments"] for c in shown.get("tool_calls") or ()
        )
        assert written.replace(" ", "").startswith(('{"a":{"a":', '<tool_call>{"name":"deep"'))
        fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
        r = post(url, response_format=fmt, max_tokens=12)
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["message"]["content"]
        assert content.replace(" ", "").startswith('{"a":{"a"')
