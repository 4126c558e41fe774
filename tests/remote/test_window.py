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
    chat, engine = _chat(url, max_continues=0)
    try:
        first = list(chat.send("Hi", GenerationOptions(max_tokens=2)))[-1]
        # The fake streams its whole reply whatever n_predict says; what counts is the ask.
        assert fake.requests[-1]["n_predict"] == 2
        assert first.text == "Hello there"
        list(chat.continue_reply(GenerationOptions(max_tokens=2)))
    finally:
        engine.close()
    prompt = _text(fake.requests[-1]["prompt"])
    # The open reply is the end of the prompt: no end of turn, no new assistant header.
    assert prompt.endswith("user: Hi\nassistant: Hello there")
