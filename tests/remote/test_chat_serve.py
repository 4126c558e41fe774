"""`localfab chat --serve`: the real app in tmux serves llama-server's API from the model it
chats with; an openai client gets answers while the app streams a reply, and the process holds
one load of the model, not two."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import LOCALFAB
from tests.serverproc import free_port, serve

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def _wait(check, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _app_process(port: int) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "--serve" in cmdline and str(port) in cmdline:
            return proc
    raise AssertionError("the app's process is not running")


def test_the_app_and_an_openai_client_share_one_model(model_path: Path, tmp_path: Path) -> None:
    import openai

    # One load of the model, as `localfab serve` holds it after a reply: the yardstick.
    with serve(model_path, "-np", "2") as alone:
        httpx.post(
            alone.url + "/completion", json={"prompt": "The sea", "n_predict": 32}, timeout=120
        )
        one_load = alone.rss()

    port, session = free_port(), f"lf-serve-{os.getpid()}"
    # The tmux server may be older than this test: its environment is not this one, so the
    # command sets what it needs.
    home = shlex.quote(str(tmp_path / "home"))
    command = (
        f"env LOCALFAB_HOME={home} LOCALFAB_MAX_TOKENS=300 LOCALFAB_MAX_CONTINUES=0 "
        f"{LOCALFAB} chat {shlex.quote(str(model_path))} --serve {port} -np 2"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command], check=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, 120, "the model")
        time.sleep(1.0)  # the app connects once the model is in
        subprocess.run(
            ["tmux", "send-keys", "-t", session, "Write a long story about the sea.", "Enter"],
            check=True,
        )

        def app_streams() -> bool:
            slots = httpx.get(url + "/slots", timeout=2).json()
            return any(s.get("is_processing") for s in slots)

        _wait(app_streams, 60, "the app's reply")
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        answer = client.completions.create(
            model="any", prompt="The capital of France is", max_tokens=12, temperature=0
        )
        assert answer.choices[0].text.strip()
        assert app_streams(), "the app's reply should still be streaming beside the client's"
        rss = _app_process(port).memory_info().rss
        # Two loads would hold the weights twice; the app's own widgets add far less.
        assert rss < 1.4 * one_load, (rss, one_load)
        screen = subprocess.run(
            ["tmux", "capture-pane", "-t", session, "-p"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "@ serv" in screen  # (the bar cuts the rest where the window is narrow)
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "C-q"], check=False)
        time.sleep(1.5)
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
    # Quitting the app stopped its server.
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)
