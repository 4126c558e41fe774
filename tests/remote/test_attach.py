"""`localfab chat` on a model a `localfab serve` of this machine already holds offers to chat
through that server instead of loading the model a second time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.commands.running import (
    RunningServer,
    forget_server,
    offer_attach,
    record_server,
    running_servers,
    server_with,
)
from localfab.config import default_paths
from tests.conftest import LOCALFAB
from tests.remote.fakeremote import fake_remote
from tests.serverproc import serve


@pytest.fixture()
def other_process() -> Iterator[int]:
    """A live process other than this one (a server's pid must be alive to count)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_records_of_live_servers_only(tmp_path: Path, other_process: int) -> None:
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path)})
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with fake_remote() as (fake, url):
        fake.model_path = str(model)
        live = RunningServer(other_process, url, str(model), "m", keyed=False)
        _check_records(paths, model, live)


def _check_records(paths: Any, model: Path, live: RunningServer) -> None:
    gone = RunningServer(2**22 + 7, "http://127.0.0.1:8", str(model), "m", keyed=False)
    kept = record_server(paths, live)
    stale = record_server(paths, gone)
    assert kept is not None and stale is not None
    assert running_servers(paths) == [live]
    assert not stale.exists()  # a record whose process is gone is removed
    assert server_with(paths, model) == live
    assert server_with(paths, model.with_name("other.gguf")) is None
    # Asked on a terminal only: here (no terminal) the model loads as before, unless --attach.
    assert offer_attach(str(model), paths, None) is None
    remote = offer_attach(str(model), paths, True)
    assert remote is not None and remote.url == live.url
    assert offer_attach(str(model), paths, False) is None
    forget_server(kept)
    assert running_servers(paths) == []


def test_records_that_are_not_offered(tmp_path: Path, other_process: int) -> None:
    """Malformed records, a URL off this machine, and a server that holds another model."""
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path)})
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    folder = paths.cache_dir / "servers"
    folder.mkdir(parents=True)
    (folder / "1.json").write_text('{"pid": "1", "url": 2}')
    (folder / "2.json").write_text("not json")
    record_server(paths, RunningServer(other_process, "http://10.1.2.3:80", str(model), "m", False))
    with fake_remote() as (fake, url):  # it says it holds another file
        record_server(paths, RunningServer(other_process + 0, url, str(model), "m", False))
        assert server_with(paths, model) is None
        assert offer_attach(str(model), paths, True) is None


def test_a_server_that_wants_a_key_this_process_lacks(
    tmp_path: Path, other_process: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path)})
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with fake_remote() as (fake, url):
        fake.model_path, fake.key = str(model), "k"
        record_server(paths, RunningServer(other_process, url, str(model), "m", True))
        monkeypatch.delenv("LLAMA_API_KEY", raising=False)
        assert offer_attach(str(model), paths, True) is None
        monkeypatch.setenv("LLAMA_API_KEY", "k")
        remote = offer_attach(str(model), paths, True)
        assert remote is not None and remote.api_key_env == "LLAMA_API_KEY"


@pytest.mark.model
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_chat_offers_the_running_server(model_path: Path, lf_env: dict[str, str]) -> None:
    paths = default_paths({"LOCALFAB_HOME": lf_env["LOCALFAB_HOME"]})
    session = f"lf-attach-{os.getpid()}"
    with serve(model_path, env=lf_env) as server:
        (running,) = running_servers(paths)
        assert running.url == server.url and Path(running.model_path) == model_path
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "100",
                "-y",
                "30",
                f"{LOCALFAB} chat {model_path}",
            ],
            env=lf_env,
            check=True,
        )
        try:
            screen = _screen_with(session, "already holds", 30)
            assert f"at {server.url} already holds" in screen
            subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)  # yes
            screen = _screen_with(session, "@ serv", 60)  # (cut where the window is narrow)
        finally:
            subprocess.run(["tmux", "send-keys", "-t", session, "C-q"], check=False)
            time.sleep(1.0)
            subprocess.run(
                ["tmux", "kill-session", "-t", session], check=False, capture_output=True
            )
    assert running_servers(paths) == []  # the stopped server took its record away


def _screen_with(session: str, text: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    screen = ""
    while time.monotonic() < deadline:
        screen = subprocess.run(
            ["tmux", "capture-pane", "-t", session, "-p", "-J"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if text in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never showed:\n{screen}")
