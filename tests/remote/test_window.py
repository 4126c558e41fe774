"""A chat on a remote keeps going as a local one does: whole old turns leave the server's
window (the system prompt stays), and a reply cut at the token limit is continued from its
tokens (the prompt ends inside the open reply)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localfab.chat.events import Shifted
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession
from localfab.engine.types import GenerationOptions, SamplingParams
from localfab.remote.client import Remote
from localfab.remote.engine import RemoteEngine
from tests.remote.fakeremote import FakeRemote, fake_remote


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def _text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


def _chat(url: str, **session: Any) -> tuple[ChatSession, RemoteEngine]:
    engine = RemoteEngine.connect(Remote(url))
    return ChatSession(engine, PromptBuilder(engine), system="Be brief.", **session), engine


def test_old_turns_leave_the_servers_window(remote: tuple[FakeRemote, str]) -> None:
    fake, url = remote
    fake.n_ctx = 120  # one token per character: a few short turns fill it
    chat, engine = _chat(url, reply_reserve=16)
    opts = GenerationOptions(max_tokens=8, sampling=SamplingParams.greedy())
    shifted = []
    try:
        for i in range(6):
            shifted += [
                e for e in chat.send(f"Question number {i}", opts) if isinstance(e, Shifted)
            ]
    finally:
        engine.close()
    assert shifted, "the window never moved"
    last = _text(fake.requests[-1]["prompt"])
    assert last.startswith("system: Be brief.\n")  # the system prompt stays
    assert "Question number 0" not in last and "Question number 5" in last
    assert all(len(r["prompt"]) + r["n_predict"] < fake.n_ctx for r in fake.requests)


def test_a_cut_reply_is_continued_from_its_tokens(remote: tuple[FakeRemote, str]) -> None:
    fake, url = remote
    chat, engine = _chat(url, max_continues=1)
    try:
        reply = list(chat.send("Hi", GenerationOptions(max_tokens=4)))[-1]
    finally:
        engine.close()
    first, second = fake.requests
    assert first["n_predict"] == 4 and _text(first["prompt"]).endswith("user: Hi\nassistant:")
    # The reply so far, token for token, is the end of the next prompt: no end of turn.
    assert _text(second["prompt"]) == _text(first["prompt"]) + "Hell"
    assert reply.text == "HellHell"  # (the fake starts its reply again; a model goes on)


def test_a_window_that_fills_mid_reply_moves(remote: tuple[FakeRemote, str]) -> None:
    """The reply reaches the end of the server's window: the session drops the oldest turn
    and the reply goes on after the moved window, as on a local model."""
    fake, url = remote
    fake.n_ctx = 160
    fake.chunks = ["x" * 400]  # a reply longer than the window
    chat, engine = _chat(url, max_continues=0, reply_reserve=16)
    events: list[Any] = []
    try:
        list(chat.send("First question", GenerationOptions(max_tokens=8)))
        fake.requests.clear()
        events = list(chat.send("Second", GenerationOptions(max_tokens=-1)))
    finally:
        engine.close()
    moved = [e for e in events if isinstance(e, Shifted)]
    assert moved and moved[0].during_reply
    first, second = fake.requests[:2]
    # Asked for exactly the cells the window had left, then again after the moved window.
    assert len(first["prompt"]) + first["n_predict"] == fake.n_ctx
    assert "First question" in _text(first["prompt"])
    assert "First question" not in _text(second["prompt"])
    assert _text(second["prompt"]).startswith("system: Be brief.\nuser: Second")
    assert len(second["prompt"]) + second["n_predict"] == fake.n_ctx
