"""The remote client against a server that misbehaves in each way a real one can: one clear
message that says what to do, and the reply so far kept in the history, marked interrupted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession
from localfab.engine.types import GenerationOptions, SamplingParams
from localfab.remote.client import Remote, RemoteClient, RemoteError
from localfab.remote.engine import RemoteEngine
from tests.remote.fakeremote import FakeRemote, fake_remote
from tests.serverproc import free_port

_OPEN: list[RemoteEngine] = []


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair
    while _OPEN:
        _OPEN.pop().close()


def _connect(url: str, **remote: Any) -> RemoteEngine:
    engine = RemoteEngine.connect(Remote(url, **remote))
    _OPEN.append(engine)
    return engine


def _chat(url: str, history: Any, **remote: Any) -> ChatSession:
    engine = _connect(url, **remote)
    chat = ChatSession(engine, PromptBuilder(engine), system="Be brief.")
    chat.history = history
    chat.session_id = history.create_session(model="fake", system=chat.system)
    return chat


def _send(chat: ChatSession, text: str = "Hi", **options: Any) -> str:
    opts = GenerationOptions(max_tokens=16, sampling=SamplingParams.greedy(), **options)
    reply = list(chat.send(text, opts))[-1]
    return str(reply.text)


def _stored(chat: ChatSession) -> tuple[str, str]:
    last = chat.history.messages(chat.session_id)[-1]  # type: ignore[union-attr]
    return last.content, last.status


def test_a_healthy_stream_is_a_reply(remote: tuple[FakeRemote, str], history: Any) -> None:
    fake, url = remote
    chat = _chat(url, history)
    assert _send(chat) == "Hello there"
    assert _stored(chat) == ("Hello there", "complete")
    sent = fake.requests[-1]
    # The prompt goes as token ids rendered here with the server's template.
    assert "".join(chr(t) for t in sent["prompt"]) == "system: Be brief.\nuser: Hi\nassistant:"
    assert sent["stream"] is True and sent["return_tokens"] is True
    assert sent["temperature"] == 0.0


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("drop", "dropped in the middle of the reply"),
        ("malformed", "malformed stream line"),
        ("error", "stopped the reply with an error: slot crashed"),
        ("truncated", "ended before the reply did"),
    ],
)
def test_a_broken_stream_keeps_the_reply_so_far(
    remote: tuple[FakeRemote, str], history: Any, mode: str, says: str
) -> None:
    fake, url = remote
    chat = _chat(url, history)
    fake.mode = mode
    with pytest.raises(RemoteError, match=says) as caught:
        _send(chat)
    assert caught.value.dropped
    content, status = _stored(chat)
    assert status == "interrupted"
    assert content == ("Hel" if mode == "drop" else "Hello")


def test_a_silent_server_times_out_and_keeps_the_reply(
    remote: tuple[FakeRemote, str], history: Any
) -> None:
    fake, url = remote
    chat = _chat(url, history, timeout=0.5)
    fake.mode = "silent"
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"sent nothing for 0 s: it may be overloaded"):
        _send(chat)
    assert time.monotonic() - started < 2.5
    assert _stored(chat) == ("Hello", "interrupted")


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (401, r"refused the request \(401, no API key was sent\): Invalid|failure 401"),
        (403, r"refused access \(403\): failure 403: the API key has no access"),
        (404, r"has no /completion \(404\)"),
        (429, r"overloaded or rate-limited \(429\) \(it asks to retry after 7 s\)"),
        (500, r"failed \(500\): failure 500; its log says more"),
        (503, r"not ready \(503\): Loading model: it may still be loading the model"),
    ],
)
def test_an_error_status_says_what_to_do(
    remote: tuple[FakeRemote, str], history: Any, status: int, says: str
) -> None:
    fake, url = remote
    chat = _chat(url, history)
    fake.mode = str(status)
    with pytest.raises(RemoteError, match=says) as caught:
        _send(chat)
    assert caught.value.status == status
    # The message is stored; the reply that never began is empty, marked interrupted.
    assert chat.history.messages(chat.session_id)[0].content == "Hi"  # type: ignore[union-attr]
    assert _stored(chat) == ("", "interrupted")


def test_a_server_that_is_not_running() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteError, match=r"cannot reach .*is the server running"):
        RemoteEngine.connect(Remote(url))


def test_a_wrong_key_and_a_right_one(
    remote: tuple[FakeRemote, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = remote
    fake.key = "sesame"
    monkeypatch.setenv("FAKE_KEY", "wrong")
    with pytest.raises(RemoteError, match=r"401, the key in \$FAKE_KEY"):
        RemoteEngine.connect(Remote(url, api_key_env="FAKE_KEY"))
    monkeypatch.setenv("FAKE_KEY", "sesame")
    assert _connect(url, api_key_env="FAKE_KEY").facts.n_ctx == 512
    monkeypatch.delenv("FAKE_KEY")
    with pytest.raises(RemoteError, match=r"FAKE_KEY holds no API key .*\(export FAKE_KEY=...\)"):
        RemoteEngine.connect(Remote(url, api_key_env="FAKE_KEY"))


def test_the_key_stays_out_of_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KEY", "sesame-1234")
    client = RemoteClient(Remote("http://127.0.0.1:1", api_key_env="FAKE_KEY"))
    assert client.http.headers["Authorization"] == "Bearer sesame-1234"
    assert "sesame" not in repr(client) and "sesame" not in repr(client.remote)
    client.close()


def test_not_a_llama_server(remote: tuple[FakeRemote, str]) -> None:
    _, url = remote
    with pytest.raises(RemoteError, match=r"has no llama-server /props endpoint"):
        RemoteEngine.connect(Remote(url + "/nothing"))


def test_stop_hangs_up_at_once(remote: tuple[FakeRemote, str], history: Any) -> None:
    """Setting cancel closes the connection mid-stream: the server sees the client leave."""
    fake, url = remote
    chat = _chat(url, history)
    fake.mode = "slow"
    cancel = threading.Event()
    events = chat.send("Hi", GenerationOptions(max_tokens=16, cancel=cancel))
    for event in events:
        if getattr(event, "text", ""):
            cancel.set()  # after the first piece of text
    assert event.finish_reason == "cancelled"
    assert fake.disconnected.wait(5)
    assert _stored(chat) == ("Hel", "interrupted")


def test_a_reply_never_asks_past_the_servers_window(
    remote: tuple[FakeRemote, str], history: Any
) -> None:
    """n_predict is what the slot has room for after the prompt (here less than max_tokens),
    to the last cell: the reply never overruns the window, and never stops short of it."""
    fake, url = remote
    fake.n_ctx = 48
    chat = _chat(url, history)
    _send(chat, "Hi")  # max_tokens 16
    (sent,) = fake.requests
    assert len(sent["prompt"]) > 48 - 16
    assert sent["n_predict"] == 48 - len(sent["prompt"])


def test_stop_while_the_server_has_not_answered_yet(remote: tuple[FakeRemote, str]) -> None:
    """A request the server queues (no headers yet, every slot busy): Esc still ends the
    reply at once, and the connection is closed."""
    fake, url = remote
    fake.mode = "queued"
    engine = _connect(url)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    events = list(engine.stream([ord(c) for c in "user: Hi"], GenerationOptions(cancel=cancel)))
    assert time.monotonic() - started < 1.0
    assert events[-1].finish_reason == "cancelled"  # type: ignore[union-attr]
