"""Tool calls in the chat app: the fake engine writes calls (parsed by the engine's own parser),
a real MCP server (the SDK's MCPServer over stdio) runs them, and the person decides."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from textual.pilot import Pilot

from localfab.chat.history import History
from localfab.mcp.approvals import Approvals
from localfab.mcp.config import ServerConfig
from localfab.mcp.servers import ToolServers
from localfab.tui.app import LocalfabApp
from localfab.tui.local_backend import LocalBackend
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.prompt_args import PromptArgsScreen
from localfab.tui.widgets.status import StatusBar
from localfab.tui.widgets.tool_cards import ToolCallCard, ToolResultCard, ToolsScreen
from tests.fake_engine import FakeEngine
from tests.mcp.conftest import http_url, stdio_config  # noqa: F401 - a fixture
from tests.tui_support import FIXED_NOW, build_app, finished, loaded, send, wait_for

pytestmark = pytest.mark.slow

CALLS = {
    "add": {"name": "box__add", "arguments": {"a": 2, "b": 40}},
    "slow": {"name": "box__slow", "arguments": {"seconds": 30}},
    "ansi": {"name": "box__ansi", "arguments": {}},
    "big": {"name": "box__big", "arguments": {"n": 1_000_000}},
    "crash": {"name": "box__crash", "arguments": {}},
}
ANSWER = "The tool said so."


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


def tool_engine() -> FakeEngine:
    """Asked to "call X", the fake model calls tool X; after a result, it answers."""
    engine = FakeEngine(delay=0.0)

    def reply(user: str) -> str:
        if "<|im_start|>tool" in engine.last_prompt.rsplit("<|im_start|>user", 1)[-1]:
            return ANSWER
        word = user.split()[-1]
        calls = [CALLS["add"]] * 10 if word == "many" else [CALLS[word]]
        blocks = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls)
        return f"Let me check.\n{blocks}"

    engine.reply = reply
    return engine


def tool_app(tmp_path: Path, call_log: Path) -> tuple[LocalfabApp, LocalBackend]:
    app, _ = build_app(History(tmp_path / "h.sqlite3"), engine=tool_engine())
    backend = app.backend
    assert isinstance(backend, LocalBackend)
    backend.servers = ToolServers((stdio_config(log=call_log),), log_file=tmp_path / "mcp.log")
    backend.approvals = Approvals(tmp_path / "mcp-approvals.json")
    return app, backend


async def tools_on(pilot: Pilot[None], app: LocalfabApp) -> None:
    await loaded(pilot, app)
    await pilot.press("f5")
    await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen))
    await pilot.press("enter")  # the first server, selected
    await pilot.click("#tools-use")
    backend = app.backend
    assert isinstance(backend, LocalBackend)
    await wait_for(pilot, lambda: any(r.in_use for r in backend.tool_servers()))


def cards(app: LocalfabApp, kind: type) -> list:
    return list(app.chat.query(kind))


async def decided_and_answered(pilot: Pilot[None], app: LocalfabApp, key: str) -> None:
    await wait_for(pilot, lambda: bool(cards(app, ToolCallCard)))
    await finished(pilot, app)
    card = cards(app, ToolCallCard)[-1]
    card.focus()
    await pilot.press(key)


def stored_roles(app: LocalfabApp) -> list[tuple[str, str]]:
    backend = app.backend
    assert isinstance(backend, LocalBackend) and backend.history is not None
    return [(m.role, m.content) for m in backend.history.messages(backend.session_id or 0)]


def run(app: LocalfabApp, body: Callable[[Pilot[None]], object]) -> None:
    import asyncio

    async def main() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await body(pilot)

    asyncio.run(main())


def test_allowed_call_runs_and_the_model_goes_on(tmp_path: Path, call_log: Path) -> None:
    app, backend = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call add")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)))
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2)
        await finished(pilot, app)
        result = cards(app, ToolResultCard)[0]
        assert result.result.text == "42" and result.result.kind == "result"
        assert stored_roles(app)[1:] == [
            ("assistant", "Let me check.\n"),
            ("tool", "42"),
            ("assistant", ANSWER),
        ]

    run(app, body)
    assert call_log.read_text() == "add 2 40\n"


def test_denied_call_never_runs_and_the_reason_reaches_the_model(
    tmp_path: Path, call_log: Path
) -> None:
    app, _ = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call add")
        await wait_for(pilot, lambda: bool(cards(app, ToolCallCard)))
        await finished(pilot, app)
        card = cards(app, ToolCallCard)[0]
        card.query_one("#reason").focus()
        await pilot.press(*"not now", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2)
        await finished(pilot, app)
        assert cards(app, ToolResultCard)[0].result.kind == "denied"
        assert ("tool", "The user denied this call. Their reason: not now") in stored_roles(app)

    run(app, body)
    assert not call_log.exists()


def test_always_allow_is_kept_and_asks_no_more(tmp_path: Path, call_log: Path) -> None:
    app, backend = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call add")
        await decided_and_answered(pilot, app, "a")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2)
        await finished(pilot, app)
        await send(pilot, app, "again call add")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 4)
        await finished(pilot, app)
        second = cards(app, ToolCallCard)[-1]
        assert second.choice == "always"

    run(app, body)
    assert call_log.read_text() == "add 2 40\nadd 2 40\n"
    assert Approvals(tmp_path / "mcp-approvals.json").entries() == ["box__add"]


def test_escape_stops_a_running_call(tmp_path: Path, call_log: Path) -> None:
    app, _ = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call slow")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: call_log.exists() and "slow 30" in call_log.read_text())
        app.chat.query_one("#prompt").focus()
        await pilot.press("escape")
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)), seconds=10)
        assert cards(app, ToolResultCard)[0].result.kind == "cancelled"
        # The turn ends: the model is not asked for a next call (see test_tools_hardening).
        notes = lambda: [str(n.message) for n in app._notifications]  # noqa: E731
        await wait_for(pilot, lambda: any("turn ends here" in n for n in notes()))
        assert app.chat.replies_finished == 1

    run(app, body)
    assert "slow done" not in call_log.read_text()


def test_escape_sequences_in_a_result_are_shown_inert(tmp_path: Path, call_log: Path) -> None:
    app, _ = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call ansi")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)))
        shown = str(cards(app, ToolResultCard)[0].query_one(".tool-output").render())
        assert "\x1b" not in shown and "␛[31m" in shown and "␛]0;pwned␇" in shown

    run(app, body)


def test_quitting_with_a_call_running_leaves_no_child(tmp_path: Path, call_log: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    app, backend = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call slow")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: call_log.exists() and "slow 30" in call_log.read_text())
        await app.action_quit()

    run(app, body)
    backend.close()  # what `localfab chat` does when the app has quit
    left = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}
    assert not left - before


def tool_chat(path: Path) -> tuple[History, int]:
    """A stored chat with one tool exchange (its result holds escape sequences)."""
    from localfab.chat.toolturns import ToolCallMade, calls_json, result_json
    from tests.tui.test_snapshots import dated

    history = History(path)
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", "What does the ansi tool say?")
    call = ToolCallMade("c1", "box__ansi", {})
    history.add_message(sid, "assistant", "Let me check.", tools=calls_json([call]))
    shown = "red \x1b[31mtext\x1b[0m and a title \x1b]0;pwned\x07"
    history.add_message(sid, "tool", shown, tools=result_json("c1", "box__ansi", "result"))
    history.add_message(sid, "assistant", ANSWER)
    dated(history, sid, FIXED_NOW - 300, FIXED_NOW - 60)
    return history, sid


def test_reopened_chat_shows_its_cards(tmp_path: Path) -> None:
    """A stored call and its result come back as cards, the result's escapes inert."""
    history, sid = tool_chat(tmp_path / "h.sqlite3")
    app, _ = build_app(history, engine=tool_engine(), session_id=sid, clock_now=FIXED_NOW)

    async def body(pilot: Pilot[None]) -> None:
        await loaded(pilot, app)
        await wait_for(pilot, lambda: bool(cards(app, ToolResultCard)))
        (call,) = cards(app, ToolCallCard)
        assert call.call.name == "box__ansi" and call.choice == "stored"
        assert not call.query("Button")  # a stored call asks nothing
        (result,) = cards(app, ToolResultCard)
        shown = str(result.query_one(".tool-output").render())
        assert "\x1b" not in shown and "␛[31m" in shown

    run(app, body)


def test_http_server_and_a_1mb_result_cut_to_the_window(
    tmp_path: Path,
    http_url: str,  # noqa: F811
) -> None:
    """Over streamable HTTP: a 1 MB result is cut to what the window has room for, the model
    is told, and its answer still fits."""
    app, backend = tool_app(tmp_path, tmp_path / "unused.log")
    backend.servers = ToolServers((ServerConfig(name="box", url=http_url),))

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call big")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2, seconds=30)
        await finished(pilot, app)
        result = cards(app, ToolResultCard)[0].result
        assert result.kind == "result" and result.full_chars == 1_000_000
        assert len(result.text) < 4096 * 3  # the fake model's whole window, in characters
        assert "result cut: 1,000,000 characters" in result.text
        used, total = backend.context_usage()
        assert used < total and app.chat.last_finish == "stop"

    run(app, body)


@pytest.mark.parametrize("theme", ["localfab-dark", "localfab-light"])
@pytest.mark.parametrize("size", [(100, 30), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_tool_cards_snapshot(
    snap_compare: Callable[..., bool],
    tmp_path: Path,
    call_log: Path,
    size: tuple[int, int],
    theme: str,
) -> None:
    """A reopened chat's call and result cards, then a new call waiting for an answer."""
    history, sid = tool_chat(tmp_path / "h.sqlite3")
    app, _ = build_app(
        history, engine=tool_engine(), session_id=sid, theme=theme, clock_now=FIXED_NOW
    )
    backend = app.backend
    assert isinstance(backend, LocalBackend)
    backend.servers = ToolServers((stdio_config(log=call_log),), log_file=tmp_path / "mcp.log")

    async def ready(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call add")
        await wait_for(pilot, lambda: len(cards(app, ToolCallCard)) == 2)
        await finished(pilot, app)
        await wait_for(pilot, lambda: app.chat.replies_finished >= 1)
        await pilot.pause(0.2)
        app.clear_notifications()
        # The live reply's figures (its speed) differ from run to run.
        views = [v for v in app.chat.query(MessageView) if v.role == "assistant"]
        views[-1].set_footer("21 tokens")
        app.chat.query_one(StatusBar).show_speed(None, None)
        cards(app, ToolCallCard)[-1].focus()
        await pilot.pause(0.2)
        app.chat.query_one("#chat-log").scroll_end(animate=False)
        await pilot.pause(0.2)

    try:
        assert snap_compare(app, terminal_size=size, run_before=ready)
    finally:
        backend.close()


def test_a_reply_with_too_many_calls_asks_about_eight(tmp_path: Path, call_log: Path) -> None:
    app, _ = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call many")
        await wait_for(pilot, lambda: len(cards(app, ToolCallCard)) == 10)
        await finished(pilot, app)
        shown = cards(app, ToolCallCard)
        assert [c.choice for c in shown] == [None] * 8 + ["deny", "deny"]
        assert shown[9].reason == "at most 8 calls per reply"

    run(app, body)


def test_a_servers_prompt_and_resource_go_in_the_prompt_box(tmp_path: Path, call_log: Path) -> None:
    app, backend = tool_app(tmp_path, call_log)

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        extras = {e.name: e for e in backend.server_extras()}
        app.chat.use_extra(extras["today"])
        box = app.chat.query_one(PromptBox)
        await wait_for(pilot, lambda: "buy milk" in box.text)
        assert box.text.startswith("[today: notes://today]\n```\n")
        box.load_text("")
        app.chat.use_extra(extras["review"])  # it has an argument: asked for first
        await wait_for(pilot, lambda: isinstance(app.screen, PromptArgsScreen))
        await pilot.press(*"x = 1", "enter")
        await wait_for(pilot, lambda: "Please review" in box.text)
        assert box.text == "Please review this code:\nx = 1"

    run(app, body)


def test_a_crash_and_a_timeout_are_cards_and_the_chat_goes_on(
    tmp_path: Path, call_log: Path
) -> None:
    app, backend = tool_app(tmp_path, call_log)
    backend.servers = ToolServers(
        (stdio_config(log=call_log, timeout=1),), log_file=tmp_path / "mcp.log"
    )

    async def body(pilot: Pilot[None]) -> None:
        await tools_on(pilot, app)
        await send(pilot, app, "please call crash")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 2, seconds=30)
        await finished(pilot, app)
        await send(pilot, app, "please call slow")
        await decided_and_answered(pilot, app, "y")
        await wait_for(pilot, lambda: app.chat.replies_finished >= 4, seconds=30)
        await finished(pilot, app)
        crashed, timed_out = (c.result for c in cards(app, ToolResultCard))
        assert crashed.kind == "crashed" and "exited during the call" in crashed.text
        assert timed_out.kind == "timeout" and "within 1 s" in timed_out.text
        assert stored_roles(app)[-1] == ("assistant", ANSWER)

    run(app, body)


def test_a_mistake_in_the_mcp_config_is_told_in_the_tools_screen(tmp_path: Path) -> None:
    from localfab.commands.chat import tool_servers
    from localfab.config import Config, default_paths

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    config = Config(mcp=(("servers", {"bad name": {"command": "x"}}),))
    problem = tool_servers(config, paths)["tools_problem"]
    assert "a name is 1 to 48 letters" in problem
    app, backend = tool_app(tmp_path, tmp_path / "calls.log")
    backend.servers, backend.tools_problem = None, problem

    async def body(pilot: Pilot[None]) -> None:
        await loaded(pilot, app)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen))
        shown = str(app.screen.query_one(".dialog-body").render())
        assert "a name is 1 to 48 letters" in shown

    run(app, body)
