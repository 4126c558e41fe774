"""The app on a remote server (the real remote backend over real sockets, against the small
llama-server look-alike of tests/remote): the status bar names the server, a reply streams, a
dropped stream is one line with the reply so far kept; the models screen's "Remote servers" tab
lists what each server serves and opens a chat on one. Snapshots at 100x30 and 80x24, dark and
light."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from localfab.chat.history import History
from localfab.remote.client import Remote
from localfab.remote.listing import RemoteRow
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.remote_backend import remote_loader
from localfab.tui.widgets.messages import MessageView
from tests.remote.fakeremote import FakeRemote, fake_remote
from tests.tui.test_models import Models
from tests.tui.test_snapshots import SIZES, THEMES
from tests.tui_support import wait_for


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def remote_app(url: str, history: History, theme: str | None = None) -> LocalfabApp:
    backend = LocalBackend(
        remote_loader(Remote(url, name="box")), history, "box", ChatOptions(max_tokens=16)
    )
    return make_app(AppDeps(backend=backend, history=history, model_name="box", theme=theme))


async def loaded(pilot: Pilot[None]) -> None:
    await wait_for(pilot, lambda: pilot.app.screen_stack and pilot.app.chat.loaded, seconds=30)


def status(app: LocalfabApp, part: str) -> str:
    return str(app.chat.query_one(f"#status-{part}").render())


@pytest.mark.anyio
async def test_a_chat_on_a_remote(remote: tuple[FakeRemote, str], tmp_path: Path) -> None:
    fake, url = remote
    history = History(tmp_path / "s.db")
    app = remote_app(url, history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        assert status(app, "model") == "fake-7b.gguf"
        assert status(app, "gpu") == "@ box"
        assert "512" in status(app, "ctx")  # the server's window
        await pilot.press(*"Hi", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1, seconds=30)
        replies = [v for v in app.chat.query(MessageView) if v.role == "assistant"]
        assert replies[-1].text == "Hello there"
        assert "TTFT" in status(app, "ttft") and "—" not in status(app, "ttft")
        assert "—" in status(app, "energy")  # the server's energy is not this machine's
        # The stream drops: one line says so, and the reply so far stays.
        fake.mode = "drop"
        await pilot.press(*"Again", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 2, seconds=30)
        assert app.chat.last_finish == "failed"
        assert any("dropped in the middle" in str(n.message) for n in app._notifications)
        stored = history.messages(app.chat.backend.session_id)
        assert [m.content for m in stored] == ["Hi", "Hello there", "Again", "Hel"]
        assert stored[-1].status == "interrupted"
    history.close()


class RemoteModels(Models):
    """Two local models and two remote servers: one serving two models, one down."""

    remotes = {"box": None, "down": None}

    def remote_rows(self) -> list[RemoteRow]:
        return [
            RemoteRow("box", "qwen3-32b", "context 32k · llamacpp", "qwen3-32b@box"),
            RemoteRow("box", "gemma3-4b", "context 8k · llamacpp", "gemma3-4b@box"),
            RemoteRow("down", "", "cannot reach http://10.0.0.9:8080: is the server running?"),
        ]


def models_app(history: History, opened: list[str], theme: str | None = None) -> LocalfabApp:
    def backend_for(name: str) -> LocalBackend:
        from tests.fake_engine import FakeEngine, fake_loader

        opened.append(name)
        return LocalBackend(fake_loader(FakeEngine(), name=name), history, name, ChatOptions())

    return make_app(
        AppDeps(
            backend=None,
            history=history,
            models=RemoteModels(),
            theme=theme,
            backend_factory=backend_for,
        )
    )


async def remote_listed(pilot: Pilot[None]) -> None:
    def table() -> DataTable[str] | None:
        found = list(pilot.app.screen.query("#remote-table").results(DataTable))
        return found[0] if found else None

    await wait_for(pilot, lambda: table() is not None)
    await pilot.press("r")
    await wait_for(pilot, lambda: (t := table()) is not None and t.row_count == 3)


@pytest.mark.anyio
async def test_the_remote_tab_opens_a_chat_on_a_servers_model(tmp_path: Path) -> None:
    history = History(tmp_path / "s.db")
    opened: list[str] = []
    app = models_app(history, opened)
    async with app.run_test(size=(100, 30)) as pilot:
        await remote_listed(pilot)
        await pilot.press("down", "down", "enter")  # the server that is down: it says why
        await pilot.pause()
        assert opened == []
        assert any("cannot reach" in str(n.message) for n in app._notifications)
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: opened == ["gemma3-4b@box"])
    history.close()


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_remote_tab_snapshot(
    snap_compare: Callable[..., bool], tmp_path: Path, size: tuple[int, int], theme: str
) -> None:
    history = History(tmp_path / "s.db")
    assert snap_compare(
        models_app(history, [], theme), terminal_size=size, run_before=remote_listed
    )
    history.close()


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_status_bar_on_a_remote_snapshot(
    snap_compare: Callable[..., bool],
    remote: tuple[FakeRemote, str],
    tmp_path: Path,
    size: tuple[int, int],
    theme: str,
) -> None:
    _, url = remote
    history = History(tmp_path / "s.db")
    assert snap_compare(remote_app(url, history, theme), terminal_size=size, run_before=loaded)
    history.close()


@pytest.mark.anyio
async def test_a_chat_on_a_chat_api_server(remote: tuple[FakeRemote, str], tmp_path: Path) -> None:
    """A server with only the OpenAI chat API: the window's estimate is said at load and
    shown in tokens; a thought and its answer stream apart."""
    fake, url = remote
    fake.flavor, fake.n_ctx, fake.think = "vllm", 2048, True
    history = History(tmp_path / "s.db")
    app = remote_app(url, history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        assert status(app, "model") == "fake-chat"
        assert "2.0k" in status(app, "ctx")  # tokens, not characters
        assert any("window is estimated" in str(n.message) for n in app._notifications)
        await pilot.press(*"Hi", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1, seconds=30)
        replies = [v for v in app.chat.query(MessageView) if v.role == "assistant"]
        assert replies[-1].text == "Hello there"
        stored = history.messages(app.chat.backend.session_id)[-1]
        assert stored.reasoning == "Thinking it over."
    history.close()
