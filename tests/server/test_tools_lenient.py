"""`serve --tool-call-lenient` over a real socket, with the openai client: a reply that is only a
bare JSON call, one brace short (as small models write them), comes back as tool_calls, whole
and streamed; without the flag it stays content, as llama-server answers it.

The test model cannot choose to call a tool. It is made to write the call honestly: a template
of the test's own hands it the last message as a plain prompt, the call written out six times,
and the base model writes the line a seventh time; the stop string `}\\n` ends the reply just
before its last brace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from tests.engine.test_toolcalls import WEATHER
from tests.server.test_tools import streamed_calls
from tests.serverproc import serve

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
LINE = json.dumps(CALL)
PLAIN = "{{ bos_token }}{{ messages[-1]['content'] }}"  # the last message as a plain prompt


@pytest.fixture()
def plain_template(tmp_path: Path) -> Path:
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN, encoding="utf-8")
    return path


def ask(client: OpenAI, *, stream: bool = False) -> object:
    return client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": (LINE + "\n") * 6}],
        tools=[WEATHER],
        stop=["}\n"],
        max_tokens=40,
        temperature=0,
        stream=stream,
    )


def test_a_bare_call_is_a_call_only_with_the_flag(model_path: Path, plain_template: Path) -> None:
    args = ("-c", "1024", "--chat-template-file", str(plain_template), "--seed", "1")
    with serve(model_path, *args) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        choice = ask(client).choices[0]  # type: ignore[attr-defined]
        # The model wrote the call one brace short: llama-server's reading keeps it as text.
        assert choice.message.content == LINE[:-1]
        assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    with serve(model_path, *args, "--tool-call-lenient") as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        choice = ask(client).choices[0]  # type: ignore[attr-defined]
        assert choice.finish_reason == "tool_calls"
        assert not choice.message.content
        (call,) = choice.message.tool_calls
        assert call.type == "function" and len(call.id) == 32
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather",
            {"city": "Paris"},
        )
        content, calls, finish = streamed_calls(ask(client, stream=True))
        assert (content, finish) == ("", "tool_calls")
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]
