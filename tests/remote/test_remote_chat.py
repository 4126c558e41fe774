"""The app's backend on real servers started here, `localfab serve` and llama.cpp's own
llama-server of the same version, both on the test model: a chat, stop (the server's slot goes
idle), regenerate, a cut reply continued, the saved chat searched, a server killed mid-reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.engine.types import SamplingParams
from localfab.remote.client import Remote, RemoteError
from localfab.tui.backend import ReplyFinished, ReplyText
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.remote_backend import remote_loader
from tests.remote.conftest import SERVERS, start
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.model

GREEDY = SamplingParams.greedy()


def _backend(url: str, history: Any, **options: Any) -> LocalBackend:
    opts = ChatOptions(sampling=GREEDY, **{"max_tokens": 24, "max_continues": 0, **options})
    backend = LocalBackend(remote_loader(Remote(url)), history, "remote-test", opts)
    backend.load(progress=lambda _: None, cancel=threading.Event())
    backend.open_session(session_id=None, system=None)
    return backend


@pytest.fixture()
def backend(model_server: ServerProcess, history: Any) -> Iterator[LocalBackend]:
    b = _backend(model_server.url, history)
    yield b
    b.close()


def _finish(events: Iterator[Any]) -> ReplyFinished:
    last = None
    for event in events:
        last = event
    assert isinstance(last, ReplyFinished)
    return last


def _slots_idle(url: str, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slots = httpx.get(url + "/slots", timeout=5).json()
        if not any(s.get("is_processing") for s in slots):
            return True
        time.sleep(0.05)
    return False


def test_chat_is_saved_and_searchable(backend: LocalBackend, history: Any) -> None:
    reply = _finish(backend.send("The lighthouse keeper said", cancel=threading.Event()))
    assert reply.text.strip() and reply.completion_tokens > 0
    assert reply.ttft_ms > 0 and reply.tokens_per_second > 0
    turns = backend.path()
    assert [t.role for t in turns] == ["user", "assistant"]
    assert turns[1].content == reply.text and turns[1].status in ("complete", "length")
    assert any(h.session_id == backend.session_id for h in history.search("lighthouse keeper"))
    used, window = backend.context_usage()
    assert window == 2048 and 0 < used < window


def test_stop_frees_the_servers_slot(backend: LocalBackend, model_server: ServerProcess) -> None:
    backend.options.max_tokens = 2000  # a reply of many seconds, were it not stopped
    cancel = threading.Event()
    texts = []
    for event in backend.send("Write a long story about the sea.", cancel=cancel):
        if isinstance(event, ReplyText) and event.text:
            texts.append(event.text)
            cancel.set()
        last = event
    assert isinstance(last, ReplyFinished) and last.finish_reason == "cancelled"
    assert last.completion_tokens < 50
    assert _slots_idle(model_server.url), "the server still generates the stopped reply"
    assert backend.path()[-1].status == "interrupted"


def test_regenerate_keeps_both_versions(backend: LocalBackend) -> None:
    first = _finish(backend.send("Once upon a time", cancel=threading.Event()))
    backend.options = ChatOptions(
        sampling=SamplingParams(temperature=1.5, seed=7), max_tokens=24, max_continues=0
    )
    _finish(backend.regenerate(None, cancel=threading.Event()))
    turns = backend.path()
    assert turns[-1].versions == 2 and turns[-1].version == 2
    back = backend.switch_version(turns[-1].message_id or 0, -1)
    assert back[-1].content == first.text


def test_a_cut_reply_continues_as_if_never_cut(
    model_server: ServerProcess, history: Any, tmp_path: Path
) -> None:
    """Greedy: 12 tokens, then 12 more by continuation, are the 24 tokens of one reply."""
    from localfab.chat.history import History

    whole = _backend(model_server.url, History(tmp_path / "other.sqlite3"), max_tokens=24)
    cut = _backend(model_server.url, history, max_tokens=12)
    try:
        expected = _finish(whole.send("The capital of France is", cancel=threading.Event()))
        first = _finish(cut.send("The capital of France is", cancel=threading.Event()))
        assert first.finish_reason == "length"
        assert cut.path()[-1].status == "length"
        more = _finish(cut.continue_reply(cancel=threading.Event()))
        assert more.text == expected.text
    finally:
        whole.close()
        cut.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_a_server_killed_mid_reply(model_path: Path, history: Any, kind: str) -> None:
    server = start(kind, model_path)
    backend = _backend(server.url, history, max_tokens=400)
    try:
        texts: list[str] = []
        with pytest.raises(RemoteError) as caught:
            for event in backend.send(
                "Write a long story about the sea.", cancel=threading.Event()
            ):
                if isinstance(event, ReplyText) and event.text:
                    texts.append(event.text)
                    if len(texts) == 3:
                        server.proc.kill()
        assert caught.value.dropped
        assert "the reply so far is kept" in str(caught.value)
        stored = backend.path()[-1]
        assert stored.status == "interrupted"
        assert stored.content.startswith("".join(texts[:3]).strip()[:5])
    finally:
        backend.close()
        server.stop()


def test_a_forced_tool_call_through_the_remote(model_server: ServerProcess) -> None:
    """The grammar of a required call goes to the server; the call is read from the reply."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatSession
    from localfab.chat.tools import parse_tools
    from localfab.engine.types import GenerationOptions
    from localfab.remote.engine import RemoteEngine
    from tests.chat.test_session_tools import ADD

    engine = RemoteEngine.connect(Remote(model_server.url))
    try:
        session = ChatSession(engine, PromptBuilder(engine), system="Be brief.")
        session.set_tools(parse_tools([ADD], "required"))
        options = GenerationOptions(sampling=GREEDY, max_tokens=48)
        reply = list(session.send("What is 2 plus 40?", options))[-1]
        (call,) = reply.tool_calls
        assert call.name == "box__add" and set(call.arguments) == {"a", "b"}  # the schema held
        session.add_tool_result(call, "42")
        session.set_tools(parse_tools([ADD], "none"))
        follow = list(session.follow_up(options))[-1]
        assert follow.text.strip()
    finally:
        engine.close()


def test_characters_cut_between_pieces_join(model_server: ServerProcess) -> None:
    """A reply of many-byte characters cut every few tokens (often inside a character) and
    continued: no piece leaves half a character behind, and the reply's tokens spell its
    text exactly (the grammar allows any tail of the text from a character on, so each
    continuation goes on from a whole character)."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatSession
    from localfab.engine.types import GenerationOptions
    from localfab.remote.engine import RemoteEngine

    text = "𠀋ꙮ é 𠀋ꙮ"
    tails = " | ".join('"' + text[i:] + '"' for i in range(len(text)))
    engine = RemoteEngine.connect(Remote(model_server.url))
    try:
        session = ChatSession(engine, PromptBuilder(engine), max_continues=12)
        options = GenerationOptions(
            sampling=SamplingParams(temperature=0, grammar=f"root ::= {tails}"), max_tokens=3
        )
        reply = list(session.send("Say it.", options))[-1]
        assert reply.text and "\ufffd" not in reply.text, reply.text
        assert reply.continues > 0
        spelled = b"".join(engine.token_bytes(t) for t in session.expected_cache)
        assert spelled.decode("utf-8").endswith(reply.text)
    finally:
        engine.close()
