"""The terminal app on the real test model: in-process with a pilot, and in tmux like a user."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.config import Config, default_paths
from localfab.engine.types import SamplingParams
from localfab.ledger.writer import Ledger, rows_to_dicts
from localfab.tui.app import AppDeps, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.model_loader import model_loader
from localfab.tui.widgets.messages import MessageView
from tests.tui_support import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.model


@pytest.mark.anyio
async def test_chat_on_the_real_model_streams_and_is_saved(model_path, tmp_path):
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    history = History(paths.sessions_db)
    loader = model_loader(str(model_path), paths, Config(), ctx_size=1024)
    ledger_file = paths.data_dir / "ledger.sqlite3"
    backend = LocalBackend(
        loader,
        history,
        model_path.name,
        ChatOptions(max_tokens=24, max_continues=0),
        ledger_file=ledger_file,
    )
    app = make_app(AppDeps(backend=backend, history=history, model_name=model_path.name))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded, seconds=300)
            chat = app.chat
            assert "ctx" in str(chat.query_one("#status-ctx").render())
            await pilot.press(*"The sea is", "enter")
            await wait_for(pilot, lambda: chat.replies_finished == 1, seconds=300)
            replies = [v for v in chat.query(MessageView) if v.role == "assistant"]
            assert replies and replies[0].text.strip()
            assert chat.last_finish in ("stop", "length")
            assert "tok/s" in str(chat.query_one("#status-speed").render())
            stored = history.messages(backend.session_id)
            assert [m.role for m in stored] == ["user", "assistant"]
            assert stored[1].content == replies[0].text
    finally:
        backend.close()  # writes the ledger's queued rows
        history.close()
    # The reply's figures are in the usage ledger; its text and the prompt are not.
    rows = rows_to_dicts(Ledger(ledger_file).rows())
    assert [r["frontend"] for r in rows] == ["chat"]
    assert rows[0]["generated_tokens"] > 0 and rows[0]["n_ctx"] == 1024
    assert b"The sea is" not in ledger_file.read_bytes()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tui_check_script_runs_the_real_app_in_tmux(tmp_path):
    env = dict(os.environ, LOCALFAB_HOME=str(tmp_path / "home"), TUI_CHECK_TIMEOUT="300")
    out = subprocess.run(
        [str(ROOT / "scripts" / "tui_check.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout
    # `localfab chat` records its replies in the ledger of its home folder.
    rows = Ledger(tmp_path / "home" / "data" / "ledger.sqlite3").rows()
    assert [r["frontend"] for r in rows_to_dicts(rows)] == ["chat"]


@pytest.mark.anyio
async def test_speculation_from_config_reaches_the_app_and_its_status_bar(model_path, tmp_path):
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    history = History(paths.sessions_db)
    config = Config(speculative=(("spec_type", "ngram-simple"), ("draft_max", 3)))
    loader = model_loader(str(model_path), paths, config, ctx_size=1024)
    # Greedy: the reply repeats the words, so there is something to draft whatever the seed.
    options = ChatOptions(max_tokens=48, max_continues=0, sampling=SamplingParams.greedy())
    backend = LocalBackend(loader, history, model_path.name, options)
    app = make_app(AppDeps(backend=backend, history=history, model_name=model_path.name))
    words = "one two three four five six seven eight nine ten " * 3
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded, seconds=300)
            chat = app.chat
            prompt = chat.query_one("#prompt")
            prompt.load_text(f"Repeat exactly: {words}")
            await pilot.press("enter")
            await wait_for(pilot, lambda: chat.replies_finished == 1, seconds=300)
            speed = str(chat.query_one("#status-speed").render())
            assert "tok/s (draft " in speed and speed.endswith("%)")
    finally:
        backend.close()
    history.close()


def test_a_chat_reopened_after_a_restart_is_restored_from_the_disk_cache(model_path, tmp_path):
    import threading

    from localfab.tui.backend import ReplyFinished

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    story = "The lighthouse keeper climbed the spiral stairs to light the lamp again. " * 80

    def started(config: Config) -> LocalBackend:
        backend = LocalBackend(
            model_loader(str(model_path), paths, config, ctx_size=2048),
            History(paths.sessions_db),
            model_path.name,
            ChatOptions(max_tokens=8, max_continues=0, sampling=SamplingParams.greedy()),
        )
        backend.load(progress=lambda _: None, cancel=threading.Event())
        return backend

    def finished(backend: LocalBackend, text: str) -> ReplyFinished:
        events = list(backend.send(text, cancel=threading.Event()))
        return [e for e in events if isinstance(e, ReplyFinished)][-1]

    first = started(Config())
    first.open_session(session_id=None, system=None)
    assert "tokens processed in" in finished(first, story).prompt_note  # a long first prompt
    session = first.session_id
    first.close()  # the app quits: the chat's state goes to the cache folder
    assert list(paths.prompt_cache_dir.glob("*.lfkv"))

    again = started(Config())  # a new app on the same model
    again.open_session(session_id=session, system=None)
    used, _ = again.context_usage()
    assert used > 1000  # the gauge is right as soon as the chat is open
    note = finished(again, "What did the keeper do?").prompt_note
    again.close()
    assert "tokens restored from cache in" in note
    assert int(note.split()[0].replace(",", "")) >= used - 10

    off = started(Config(prompt_cache=False))  # the disk tier turned off in config.toml
    off.open_session(session_id=session, system=None)
    assert "tokens processed in" in finished(off, "And then?").prompt_note
    off.close()


def test_a_template_file_drops_the_notice_about_the_models_own(model_path, tmp_path):
    """The test model has no chat template, so a load says it uses a built-in one; with
    --chat-template-file that notice no longer applies and the model card does not show it."""
    import threading

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    plain = model_loader(str(model_path), paths, Config(), ctx_size=512)(
        lambda p: None, threading.Event()
    )
    try:
        assert any("no chat template" in n for n in plain.info.notices)
    finally:
        plain.close()
    loaded = model_loader(str(model_path), paths, Config(), ctx_size=512, template_file=template)(
        lambda p: None, threading.Event()
    )
    try:
        assert not any("no chat template" in n for n in loaded.info.notices)
    finally:
        loaded.close()


@pytest.mark.anyio
async def test_a_forced_tool_call_on_the_real_model(model_path, tmp_path):
    """The real model, tools required: its call (held by the grammar) is asked about, run on
    a real MCP server, and answered; the model then replies without tools (one round)."""
    from localfab.mcp.servers import ToolServers
    from localfab.tui.widgets.tool_cards import ToolCallCard, ToolResultCard
    from tests.mcp.conftest import stdio_config

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    history = History(paths.sessions_db)
    loader = model_loader(str(model_path), paths, Config(), ctx_size=2048)
    options = ChatOptions(
        max_tokens=48, max_continues=0, sampling=SamplingParams.greedy(), tool_choice="required"
    )
    call_log = tmp_path / "calls.log"
    backend = LocalBackend(loader, history, model_path.name, options, max_tool_rounds=1)
    backend.servers = ToolServers(
        (stdio_config(log=call_log, tools=("add",)),), log_file=tmp_path / "mcp.log"
    )
    app = make_app(AppDeps(backend=backend, history=history, model_name=model_path.name))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded, seconds=300)
            chat = app.chat
            await pilot.press("f5")
            await pilot.pause(0.2)
            await pilot.press("enter")
            await pilot.click("#tools-use")
            await wait_for(pilot, lambda: any(r.in_use for r in backend.tool_servers()))
            await pilot.press(*"Add 2 and 40", "enter")
            await wait_for(pilot, lambda: bool(chat.query(ToolCallCard)), seconds=300)
            await wait_for(pilot, lambda: not chat.streaming, seconds=300)
            card = chat.query_one(ToolCallCard)
            assert card.call.name == "box__add" and set(card.call.arguments) == {"a", "b"}
            card.focus()
            await pilot.press("y")
            await wait_for(pilot, lambda: chat.replies_finished >= 2, seconds=300)
            result = chat.query_one(ToolResultCard).result
            assert result.kind == "result"
            args = card.call.arguments
            assert result.text == str(args["a"] + args["b"])  # the server's own sum
            roles = [m.role for m in history.messages(backend.session_id)]
            assert roles == ["user", "assistant", "tool", "assistant"]
    finally:
        backend.close()
        history.close()
    assert call_log.read_text().startswith("add ")


def test_the_app_loads_the_projector_given_or_found_beside_the_model(model_path, tmp_path):
    """--mmproj's projector, or the mmproj*.gguf beside the model file, planned and loaded with
    the model (a note says where and what an image costs); one made for another model beside it
    is not taken, one given that is no projector stops the load."""
    import threading

    from localfab.errors import LocalfabError
    from tests.engine.test_vision import MMPROJ, model_in_folder

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    folder = model_in_folder(model_path, tmp_path / "model").parent
    given = MMPROJ.write_projector(tmp_path / "projector.gguf", 640)
    other = MMPROJ.write_projector(folder / "mmproj-other.gguf", 320)

    def load(**kwargs):
        return model_loader(str(folder / "model.gguf"), paths, Config(), ctx_size=512, **kwargs)(
            lambda progress: None, threading.Event()
        )

    seeing = load(mmproj=given)
    assert seeing.engine.projector is not None
    assert any(
        n.startswith("reads images: vision projector projector.gguf") for n in seeing.info.notices
    )
    seeing.close()
    blind = load()  # only the projector of another model lies beside it: not taken
    assert getattr(blind.engine, "projector", None) is None
    assert not any("image" in n for n in blind.info.notices)
    blind.close()
    MMPROJ.write_projector(folder / "mmproj-f16.gguf", 640)
    found = load()
    assert (
        found.engine.projector is not None and found.engine.projector.path.name == "mmproj-f16.gguf"
    )
    found.close()
    other.unlink()
    with pytest.raises(LocalfabError, match="not a vision projector"):
        load(mmproj=model_path)


@pytest.mark.anyio
async def test_a_chat_with_an_image_on_the_real_model(model_path, tmp_path, halfcell):
    """The app on the test model with the synthetic projector: an image attached by /image
    goes with the message (encoded once, its picture drawn), the reply comes, the next turn does
    not encode it again, and the chat holds it when reopened."""
    from tests.engine.test_vision import MMPROJ, NOISE

    projector = MMPROJ.write_projector(tmp_path / "mmproj.gguf", 640)
    image = tmp_path / "noise.png"
    image.write_bytes(NOISE)
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    history = History(paths.sessions_db)
    loader = model_loader(str(model_path), paths, Config(), ctx_size=1024, mmproj=projector)
    backend = LocalBackend(loader, history, model_path.name, ChatOptions(max_tokens=8))
    app = make_app(AppDeps(backend=backend, history=history, model_name=model_path.name))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen_stack and app.chat.loaded, seconds=300)
            chat = app.chat
            assert backend.reads_images()
            box = chat.query_one("#prompt")
            box.insert(f"/image {image}")
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(chat.attached) == 1)
            box.insert("What is in the picture?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: chat.replies_finished == 1, seconds=300)
            await wait_for(pilot, lambda: len(chat.query(".picture")) == 1)
            seeing = backend._loaded.engine.projector  # noqa: SLF001
            assert seeing.n_encoded == 1
            box.insert("And its colours?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: chat.replies_finished == 2, seconds=300)
            assert seeing.n_encoded == 1  # the image's cells were kept for the next turn
            (first, *_) = history.messages(backend.session_id)
            assert first.content == "What is in the picture?" and "noise.png" in first.images
    finally:
        backend.close()
        history.close()
