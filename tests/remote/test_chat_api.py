"""A server that speaks only the OpenAI chat API (as vLLM, Ollama, LM Studio or a hosted API
do), under the same chat session: messages sent as messages, the window estimated in characters
with old turns leaving it whole, a thought apart, continuation on vLLM only, and the faults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localfab.chat.events import Shifted
from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession
from localfab.engine.types import GenerationOptions, SamplingParams
from localfab.errors import UsageError
from localfab.remote.chat_api import CHARS_PER_TOKEN, ChatApiEngine, read_turns
from localfab.remote.client import Remote, RemoteError
from localfab.remote.engine import connect
from tests.remote.fakeremote import FakeRemote, fake_remote

OPTS = GenerationOptions(max_tokens=16, sampling=SamplingParams(temperature=0.2, seed=5))


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as (fake, url):
        fake.flavor = "openai"
        yield fake, url


@pytest.fixture()
def opened() -> Iterator[list[Any]]:
    engines: list[Any] = []
    yield engines
    for engine in engines:
        engine.close()


def _chat(url: str, opened: list[Any], history: History | None = None, **kw: Any) -> ChatSession:
    engine = connect(Remote(url, **kw))
    opened.append(engine)
    assert isinstance(engine, ChatApiEngine)
    chat = ChatSession(engine, PromptBuilder(engine), system="Be brief.")
    if history is not None:
        chat.history = history
        chat.session_id = history.create_session(model="fake-chat", system=chat.system)
    return chat


def test_messages_go_as_messages(remote: tuple[FakeRemote, str], opened: list[Any]) -> None:
    fake, url = remote
    chat = _chat(url, opened)
    assert list(chat.send("Hi <|lf:user|> there", OPTS))[-1].text == "Hello there"
    list(chat.send("And again?", OPTS))
    body = fake.requests[-1]
    assert body["model"] == "fake-chat" and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <|lf:user|> there"},  # text, never a turn mark
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "And again?"},
    ]
    assert body["temperature"] == 0.2 and body["seed"] == 5 and body["max_tokens"] == 16
    assert "continue_final_message" not in body


def test_the_window_is_estimated_and_old_turns_leave_it(
    remote: tuple[FakeRemote, str], opened: list[Any]
) -> None:
    fake, url = remote
    fake.flavor = "vllm"
    fake.n_ctx = 40  # tokens, as vLLM's max_model_len says
    chat = _chat(url, opened)
    engine = chat.engine
    assert isinstance(engine, ChatApiEngine)
    assert engine.n_ctx == 40 * CHARS_PER_TOKEN and "40 tokens (the server's)" in engine.window_note
    shifted = [
        e for i in range(5) for e in chat.send(f"Question {i}", OPTS) if isinstance(e, Shifted)
    ]
    assert shifted
    messages = fake.requests[-1]["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[-1] == {"role": "user", "content": "Question 4"}
    assert {"role": "user", "content": "Question 0"} not in messages


def test_unknown_context_is_assumed_and_said(
    remote: tuple[FakeRemote, str], opened: list[Any]
) -> None:
    _, url = remote
    engine = connect(Remote(url))
    opened.append(engine)
    assert "assumed: the server says none" in engine.window_note


def test_a_thought_comes_apart(
    remote: tuple[FakeRemote, str], opened: list[Any], history: History
) -> None:
    fake, url = remote
    fake.think = True
    chat = _chat(url, opened, history)
    reply = list(chat.send("Hi", OPTS))[-1]
    assert reply.text == "Hello there"
    stored = history.messages(chat.session_id or 0)[-1]
    assert stored.content == "Hello there" and stored.reasoning == "Thinking it over."


def test_continuation_on_vllm_and_elsewhere(
    remote: tuple[FakeRemote, str], opened: list[Any]
) -> None:
    fake, url = remote
    chat = _chat(url, opened)
    assert chat.max_continues == 0  # not vLLM: a cut reply is not continued
    list(chat.send("Hi", OPTS))
    with pytest.raises(UsageError, match="cannot continue a reply seamlessly"):
        list(chat.continue_reply(OPTS))
    fake.flavor = "vllm"
    chat = _chat(url, opened)
    list(chat.send("Hi", OPTS))
    list(chat.continue_reply(OPTS))
    body = fake.requests[-1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello there"}


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("drop", "dropped in the middle"),
        ("malformed", "malformed stream line"),
        ("401", r"refused the request \(401"),
        ("429", r"\(429\)"),
    ],
)
def test_faults_keep_the_reply_so_far(
    remote: tuple[FakeRemote, str], opened: list[Any], history: History, mode: str, says: str
) -> None:
    fake, url = remote
    chat = _chat(url, opened, history)
    fake.mode = mode
    with pytest.raises(RemoteError, match=says):
        list(chat.send("Hi", OPTS))
    stored = history.messages(chat.session_id or 0)[-1]
    assert stored.status == "interrupted"
    assert stored.content == {"drop": "Hel", "malformed": "Hello"}.get(mode, "")


def test_a_model_the_server_does_not_serve(remote: tuple[FakeRemote, str]) -> None:
    _, url = remote
    with pytest.raises(RemoteError, match="has no model 'nope'; it serves: fake-chat"):
        connect(Remote(url, model="nope"))


def test_reading_turns_back() -> None:
    engine = ChatApiEngine.__new__(ChatApiEngine)
    tokens = engine.tokenize("<|lf:user|>Hi<|lf:end|><|lf:assistant|>Hel")
    assert read_turns(tokens) == (
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
        True,
    )
    tokens = engine.tokenize("<|lf:user|>Hi<|lf:end|><|lf:assistant|>")
    assert read_turns(tokens) == ([{"role": "user", "content": "Hi"}], False)


def test_a_configured_context_wins(remote: tuple[FakeRemote, str], opened: list[Any]) -> None:
    _, url = remote
    engine = connect(Remote(url, context=8192))
    opened.append(engine)
    assert engine.n_ctx == 8192 * CHARS_PER_TOKEN
    assert "8192 tokens (as configured)" in engine.window_note


def test_model_names_as_ollama_and_hosted_apis_list_them(remote: tuple[FakeRemote, str]) -> None:
    fake, url = remote
    fake.models = ["llama3.2:latest", "qwen3:8b"]
    engine = connect(Remote(url, model="llama3.2"))  # Ollama's :latest
    engine.close()
    assert engine.facts.model == "llama3.2:latest"
    with pytest.raises(RemoteError, match=r"serves several models: name one \(llama3.2:latest"):
        connect(Remote(url))
