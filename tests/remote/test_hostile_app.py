"""The chat app against a remote server that sends one event of tens of MiB (the real remote
backend over real sockets, against the llama-server look-alike): the reply ends with a line
that says why, the history keeps no giant message, and Esc stops a reply while such an event
trickles in. And F5 with no model loaded says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.remote.client import Remote
from localfab.tui.app import AppDeps, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.remote_backend import remote_loader
from tests.remote.fakeremote import FakeRemote, fake_remote
from tests.tui_support import wait_for


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def _app(url: str, history: History):  # type: ignore[no-untyped-def]
    backend = LocalBackend(
        remote_loader(Remote(url, name="box")), history, "box", ChatOptions(max_tokens=16)
    )
    return make_app(AppDeps(backend=backend, history=history, model_name="box"))


@pytest.mark.anyio
async def test_a_huge_event_ends_the_reply_and_is_not_stored(
    remote: tuple[FakeRemote, str], tmp_path: Path
) -> None:
    fake, url = remote
    history = History(tmp_path / "s.db")
    app = _app(url, history)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded, seconds=30)
        fake.mode, fake.huge = "huge", 50 << 20
        await pilot.press(*"Hi", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1, seconds=30)
        assert app.chat.last_finish == "failed"
        assert any("over 8 MiB: stopped" in str(n.message) for n in app._notifications)
        stored = history.messages(app.chat.backend.session_id)
        assert sum(len(m.content) for m in stored) < 1000
    history.close()


@pytest.mark.anyio
async def test_esc_stops_a_reply_while_a_huge_event_trickles_in(
    remote: tuple[FakeRemote, str], tmp_path: Path
) -> None:
    fake, url = remote
    history = History(tmp_path / "s.db")
    app = _app(url, history)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded, seconds=30)
        fake.mode, fake.huge, fake.huge_pause = "huge", 7 << 20, 0.2
        await pilot.press(*"Hi", "enter")
        await wait_for(pilot, lambda: app.chat.streaming, seconds=10)
        await pilot.pause(0.6)  # MiBs of one event in, its line not ended
        stopped = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1, seconds=10)
        assert time.monotonic() - stopped < 2
        assert app.chat.last_finish == "cancelled"
        assert fake.disconnected.wait(5)
    history.close()


@pytest.mark.anyio
async def test_f5_with_no_model_says_none_is_loaded(tmp_path: Path) -> None:
    history = History(tmp_path / "s.db")
    app = make_app(AppDeps(backend=None, history=history))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f5")
        await wait_for(pilot, lambda: bool(app._notifications), seconds=5)
        said = [str(n.message) for n in app._notifications]
        assert any(s.startswith("No model is loaded") for s in said), said
        assert not any("cannot call tools" in s for s in said), said
    history.close()
