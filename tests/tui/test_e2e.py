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
from localfab.tui.local_backend import ChatOptions, LocalBackend, model_loader
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
